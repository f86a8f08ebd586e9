"""Decode tokens/s and memory: converted models on the static decode path (CUDA graph) vs the source Llama with
transformers' StaticCache and torch.compile(mode="reduce-overhead"), at several batch sizes and contexts.

Per (batch, context) cell, one greedy decode step (forward + argmax feeding the next step) is timed over
`--repeats` consecutive steps with one synchronisation at the end:
- source: a `StaticCache` of `context + 1` slots whose first `context` are filled with random K/V; its forward
  compiled as `generate(cache_implementation="static")` compiles it (`torch.compile(model.__call__,
  mode="reduce-overhead")`, CUDA graphs through inductor); the cache length is put back to `context` after
  every step, so every step attends to `context` keys. On CPU (no CUDA graphs) it runs eagerly unless
  `--compile yes`.
- converted, static: `t2r.models.static_decode.StaticDecoder` (one CUDA graph per step) after a real prefill
  of a 16-token prompt; the step's cost does not depend on how many tokens the state has seen.
- converted, eager: the model's eager forward with its `T2RCache`, the step `model.generate` runs.
Weights are random, shaped as a real model (`SHAPES` of bench_generate.py, plus `tiny` for a CPU smoke test).
Memory: the cache or state (MiB) and, on CUDA, the peak allocated during the cell above what was allocated
before it (cache, activations, graph pools). An out-of-memory cell is reported as OOM.

    python benchmarks/bench_decode.py --shape smollm2                      # batches 1 16 64, contexts 2K 8K 32K
    python benchmarks/bench_decode.py --shape tiny --repeats 5             # CPU smoke test (< 1 min)
"""

from __future__ import annotations

import argparse
import gc
import platform
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

import t2r
from t2r.models.generation_cache import T2RCache
from t2r.models.static_decode import StaticDecoder

sys.path.insert(0, str(Path(__file__).parent))
from bench_generate import SHAPES as GENERATE_SHAPES  # noqa: E402

SHAPES = {**GENERATE_SHAPES,
          "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True)}
PROMPT = 16


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_decode(step, device, repeats: int, warmup: int = 3) -> float:
    """Mean ms of `step()` over `repeats` back-to-back calls after `warmup` (compile / capture) calls."""
    for _ in range(warmup):
        step()
    sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        step()
    sync(device)
    return (time.perf_counter() - start) * 1e3 / repeats


def mib(n: int) -> str:
    return f"{n / 2**20:,.1f}" if n >= 2**20 else f"{n / 2**20:.3g}"


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def source_cell(model, config, batch, context, device, dtype, compile_forward):
    """Step of the source with a StaticCache holding `context` random tokens; (step, cache bytes)."""
    cache = StaticCache(config=config, max_cache_len=context + 1)
    kv_shape = (batch, config.num_key_value_heads, context, config.head_dim)
    for layer_idx in range(config.num_hidden_layers):
        cache.update(torch.randn(kv_shape, device=device, dtype=dtype),
                     torch.randn(kv_shape, device=device, dtype=dtype), layer_idx)
    forward = torch.compile(model.__call__, mode="reduce-overhead") if compile_forward else model.__call__
    token = torch.randint(0, config.vocab_size, (batch, 1), device=device)
    position = torch.full((batch, 1), context, device=device)

    def step():
        nonlocal token
        if compile_forward:
            torch.compiler.cudagraph_mark_step_begin()
        logits = forward(input_ids=token, position_ids=position, past_key_values=cache, use_cache=True).logits
        for layer in cache.layers:  # in place (static address): every step sees `context` cached tokens
            layer.cumulative_length.fill_(context)
        token = logits[:, -1].argmax(-1, keepdim=True)
    return step, nbytes(t for layer in cache.layers for t in (layer.keys, layer.values))


def static_cell(model, config, batch, context, device):
    decoder = StaticDecoder(model, batch)
    decoder.prefill(torch.randint(0, config.vocab_size, (batch, PROMPT), device=device))
    decoder.cache.seen_tokens = context  # cosmetic: nothing in the step reads it
    token = torch.randint(0, config.vocab_size, (batch, 1), device=device)

    def step():
        nonlocal token
        token = decoder.step(token).argmax(-1, keepdim=True)
    return step, nbytes(b for bufs in decoder.cache.buffers.values() for b in bufs)


def eager_cell(model, config, batch, context, device):
    cache = T2RCache(model.config)
    model(torch.randint(0, config.vocab_size, (batch, PROMPT), device=device), past_key_values=cache, use_cache=True)
    token = torch.randint(0, config.vocab_size, (batch, 1), device=device)
    position = torch.full((batch, 1), context, device=device)

    def step():
        nonlocal token
        logits = model(token, past_key_values=cache, position_ids=position, use_cache=True).logits
        token = logits[:, -1].argmax(-1, keepdim=True)
    states = [cache.get_state(i) for i in range(config.num_hidden_layers)]
    return step, nbytes(t for s in states for t in (s if isinstance(s, tuple) else (s,)))


def run_cell(make, device, repeats):
    """(ms, cache bytes, peak extra bytes or None), or the error text of an out-of-memory cell."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    try:
        step, cache_bytes = make()
        ms = time_decode(step, device, repeats)
        peak = torch.cuda.max_memory_allocated() - base if device.type == "cuda" else None
        return ms, cache_bytes, peak
    except torch.OutOfMemoryError:
        return "OOM"
    finally:
        step = None  # drop the cell's cache, decoder and graphs before the next one
        gc.collect()
        torch.cuda.empty_cache() if device.type == "cuda" else None


def write_table(rows, args, device, dtype, final: bool = False) -> None:
    """The table so far, written after every cell (a run cut short by a time limit keeps what it measured)."""
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    lines = [
        f"Decode step, {args.shape} shape (random weights), {dtype}, device: {name}",
        f"torch {torch.__version__}, transformers {transformers.__version__}, triton {triton_version}, "
        f"python {platform.python_version()}",
        "",
        "| batch | context | model | path | ms / step | tokens/s | cache MiB | peak extra MiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for batch, context, label, path, result in rows:
        if isinstance(result, str):
            lines.append(f"| {batch} | {context} | {label} | {path} | {result} | | | |")
            continue
        ms, cache_bytes, peak = result
        peak_text = mib(peak) if peak is not None else "-"
        lines.append(f"| {batch} | {context} | {label} | {path} | {ms:.2f} | {batch * 1e3 / ms:,.0f} | "
                     f"{mib(cache_bytes)} | {peak_text} |")
    table = "\n".join(lines)
    print(table) if final else None
    out = args.out or Path(__file__).parent / "results" / f"decode_{name.replace(' ', '_')}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table + "\n\nCommand: python " + " ".join(sys.argv) + "\n")
    print(f"written to {out}") if final else None



@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--contexts", type=int, nargs="+", default=None,
                        help="tokens in the cache (default 2048 8192 32768; 256 1024 for --shape tiny)")
    parser.add_argument("--targets", nargs="+", default=["gsa", "gla", "retnet"])
    parser.add_argument("--no-eager", action="store_true", help="skip the converted models' eager rows")
    parser.add_argument("--compile", choices=("auto", "yes", "no"), default="auto",
                        help="compile the source's forward (auto: on CUDA only)")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    contexts = args.contexts or ([256, 1024] if args.shape == "tiny" else [2048, 8192, 32768])
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    compile_forward = args.compile == "yes" or (args.compile == "auto" and device.type == "cuda")
    torch._dynamo.config.cache_size_limit = max(64, torch._dynamo.config.cache_size_limit)
    torch.manual_seed(0)
    config = LlamaConfig(**SHAPES[args.shape])
    source = LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()
    converted = {target: t2r.convert(source, target).eval() for target in args.targets}
    source_label = "StaticCache + compile (reduce-overhead)" if compile_forward else "StaticCache, eager"

    rows = []
    for batch in args.batches:
        for context in contexts:
            cells = [("source (softmax)", source_label,
                      lambda: source_cell(source, config, batch, context, device, dtype, compile_forward))]
            for target, model in converted.items():
                cells.append((target, "static" + (" + CUDA graph" if device.type == "cuda" else ", eager on CPU"),
                              lambda model=model: static_cell(model, config, batch, context, device)))
                if not args.no_eager:
                    cells.append((target, "eager forward (generate)",
                                  lambda model=model: eager_cell(model, config, batch, context, device)))
            for label, path, make in cells:
                result = run_cell(make, device, args.repeats)
                rows.append((batch, context, label, path, result))
                print(f"batch {batch} context {context} {label} [{path}]: "
                      + (result if isinstance(result, str) else f"{result[0]:.2f} ms"), flush=True)
                write_table(rows, args, device, dtype)
            if compile_forward:
                torch._dynamo.reset()  # one compiled source per cell; free its graphs

    write_table(rows, args, device, dtype, final=True)

if __name__ == "__main__":
    main()
