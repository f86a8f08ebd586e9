"""Decode speed and memory of a converted model vs its softmax source, at growing context lengths.

One decode step (one new token for every sequence of the batch) is timed through the model's forward with
its cache, on a cache that already holds `context` tokens: for the source a KV cache, for the converted model
the recurrent state (built by a real prefill of a short prompt, then advanced: the state's size and the step's
cost do not depend on how many tokens it has seen). Weights are random with the shape of a real model
(speed does not depend on their values). Prints a table and writes it, with the device, to benchmarks/results.

    python benchmarks/bench_generate.py --shape smollm2 --batch 16 --contexts 2048 8192 32768
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

import t2r

SHAPES = {
    # SmolLM2-135M
    "smollm2": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, head_dim=64, tie_word_embeddings=True),
    # one quarter of Llama-3-8B / Mistral-7B's depth, full width
    "mistral-8l": dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=8,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=128),
}


def time_steps(step, repeats: int) -> float:
    """Median milliseconds of `step()` after a warm-up (device-synchronised)."""
    for _ in range(3):
        step()
    torch.cuda.synchronize() if torch.cuda.is_available() else None
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def cache_bytes(cache) -> int:
    total = 0
    for layer in cache.layers:
        for name in ("keys", "values", "gates"):
            tensor = getattr(layer, name, None)
            total += tensor.numel() * tensor.element_size() if isinstance(tensor, torch.Tensor) else 0
        for state in getattr(layer, "recurrent_states", {}).values():
            total += state.numel() * state.element_size() if state is not None else 0
    return total


def source_step_fn(model, config, batch, context, device, dtype):
    cache = DynamicCache(config=config)
    for layer_idx in range(config.num_hidden_layers):
        kv = torch.randn(batch, config.num_key_value_heads, context, config.head_dim, device=device, dtype=dtype)
        cache.update(kv, kv.clone(), layer_idx)
    token = torch.randint(0, config.vocab_size, (batch, 1), device=device)
    position = torch.full((batch, 1), context, device=device)

    def step():
        model(token, past_key_values=cache, position_ids=position, use_cache=True)
        for layer in cache.layers:  # keep the context length fixed across repeats
            layer.keys, layer.values = layer.keys[:, :, :context], layer.values[:, :, :context]
    return step, cache


def converted_step_fn(model, config, batch, context, device):
    prompt = torch.randint(0, config.vocab_size, (batch, 16), device=device)
    cache = model(prompt, use_cache=True).past_key_values
    token = torch.randint(0, config.vocab_size, (batch, 1), device=device)
    position = torch.full((batch, 1), context, device=device)

    def step():
        model(token, past_key_values=cache, position_ids=position, use_cache=True)
    return step, cache


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--contexts", type=int, nargs="+", default=[2048, 8192, 32768])
    parser.add_argument("--targets", nargs="+", default=["gsa", "gla", "retnet"])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    config = LlamaConfig(**SHAPES[args.shape])
    source = LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()
    converted = {target: t2r.convert(source, target).eval() for target in args.targets}

    rows = []
    for context in args.contexts:
        step, cache = source_step_fn(source, config, args.batch, context, device, dtype)
        rows.append(("softmax (KV cache)", context, time_steps(step, args.repeats), cache_bytes(cache)))
        del cache, step
        torch.cuda.empty_cache() if device == "cuda" else None
        for target, model in converted.items():
            step, cache = converted_step_fn(model, config, args.batch, context, device)
            rows.append((f"{target} (state)", context, time_steps(step, args.repeats), cache_bytes(cache)))

    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    lines = [
        f"Decode step, {args.shape} shape, batch {args.batch}, {dtype}, device: {name}",
        "",
        "| model | context | ms / step | tokens/s | cache MiB |",
        "|---|---|---|---|---|",
    ]
    for label, context, ms, nbytes in rows:
        lines.append(f"| {label} | {context} | {ms:.2f} | {args.batch * 1e3 / ms:,.0f} | {nbytes / 2**20:,.1f} |")
    table = "\n".join(lines)
    print(table)
    out = Path(__file__).parent / "results" / f"generate_{args.shape}_{name.replace(' ', '_')}.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text(table + "\n\nCommand: python benchmarks/bench_generate.py " +
                   f"--shape {args.shape} --batch {args.batch} --contexts {' '.join(map(str, args.contexts))}\n")


if __name__ == "__main__":
    main()
