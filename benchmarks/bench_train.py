"""Whole-model training throughput, converted vs original, side by side in one run.

The same loop for every contender (`t2r.eval.train_bench.training_steps`, which `t2r bench --train` runs too):
fp32 master weights, bf16 autocast (on CUDA), fused AdamW, forward with labels, backward, step. A fixed number
of tokens per step (`--tokens-per-step`) split into rows of `context` tokens; `--warmup` steps (Triton compiles,
allocator) before `--steps` timed ones. Random weights with the shape of a real model (speed does not depend on
their values). Prints a table and writes it, with the device and the command, to
benchmarks/results/train_<device>.md.

    python benchmarks/bench_train.py --shape smollm2 --contexts 2048 8192 16384
    python benchmarks/bench_train.py --shape smollm2 --contexts 2048 --modes eager compiled   # both, side by side
    python benchmarks/bench_train.py --shape tiny --contexts 64 --tokens-per-step 256 --steps 1   # CPU smoke test
    python benchmarks/bench_train.py --shape smollm2 --contexts 2048 --loss kl --modes eager compiled  # distillation
    python benchmarks/bench_train.py --shape smollm2 --contexts 2048 --loss kl --window 64 --hybrid-every 4 \
        --hybrid-target gdn       # every target with window 64 + 4 sinks, and a gdn hybrid

`--loss kl` times distillation as `t2r finetune`'s KL stages run it (`t2r.train.losses.stage_loss`, fused
chunked KL): the source, in bf16 and frozen, is every model's teacher, and a "teacher forward" row gives the
floor its forward alone sets (tokens/s of the forward without the student).

`--modes compiled` runs every model with regional compilation: each decoder layer through `torch.compile`
(default mode, static shapes), one compiled graph that all layers share, since they run the same code. Inductor
fuses the norms, rotary, activations and gate arithmetic around the attention op, which is most of what a small
model's step spends on the host; the Triton kernels run inside the graph as custom ops (`t2r/ops/backend.py`).
The warm-up steps include compilation; the first one is checked against the same batch run eagerly
(`torch.compiler.set_stance("force_eager")`), and the difference is printed with the graph-break count.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

import t2r
from t2r.eval.bench import random_ids
from t2r.eval.train_bench import next_token_loss, rows_per_step, training_steps
from t2r.models.compilation import compile_layers
from t2r.train.losses import stage_loss
from t2r.train.recipe import StageSection

sys.path.insert(0, str(Path(__file__).parent))
from bench_generate import SHAPES as GENERATE_SHAPES  # noqa: E402

SHAPES = {**GENERATE_SHAPES,
          "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True)}


def contenders(source, targets, hybrid_every: int, hybrid_target: str = "gsa", window: int = 0, sinks: int = 0):
    """(name, build) pairs: the source itself, each target on every layer, and `hybrid_target` with every
    `hybrid_every`-th layer left softmax; with `window`, every converted layer adds window + sinks."""
    layers = source.config.num_hidden_layers
    options = dict(window=window, sinks=sinks) if window else {}
    suffix = f" + window {window}+{sinks}" if window else ""
    yield "source (SDPA)", lambda: source
    for target in targets:
        windowed = options and "window" in t2r.MIXERS[target].options.field_names()  # fox has no window
        yield (target + (suffix if windowed else ""),
               lambda target=target, windowed=windowed: t2r.convert(source, target, **(options if windowed else {})))
    if hybrid_every:
        kept = set(range(hybrid_every - 1, layers, hybrid_every))
        converted = [i for i in range(layers) if i not in kept]
        yield (f"{hybrid_target} hybrid (1 in {hybrid_every} softmax){suffix}",
               lambda: t2r.convert(source, hybrid_target, layers=converted, **options))


def check_against_eager(model, context: int):
    """check_first for a compiled model: its first loss against the same batch run eagerly."""
    def check(ids, loss):
        autocast = torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=ids.device.type == "cuda")
        with torch.no_grad(), autocast, torch.compiler.set_stance("force_eager"):
            eager = model(input_ids=ids, labels=ids, use_cache=False).loss.item()
        print(f"  {context}: compiled loss {loss.item():.5f} vs eager {eager:.5f}", flush=True)
        if not abs(loss.item() - eager) <= 1e-2:
            raise RuntimeError(f"compiled loss {loss.item()} != eager loss {eager}")
    return check


def distill_loss(teacher):
    """loss_fn for training_steps: T^2 KL(teacher || student) as a `loss: kl` stage computes it (fused)."""
    stage = StageSection(name="distill", loss={"kl": 1.0})

    def loss_fn(model, ids):
        step = stage_loss(model, teacher, None, stage, contextlib.nullcontext, fused=True)
        return step({"input_ids": ids, "labels": ids, "use_cache": False})[0]
    return loss_fn


@torch.inference_mode()
def teacher_floor(teacher, contexts, tokens_per_step: int, steps: int) -> str:
    """A table row: tokens/s of the teacher's forward alone (under bf16 autocast), the most a KL step can reach."""
    device = next(teacher.parameters()).device
    cells = []
    for context in contexts:
        ids = random_ids(teacher.config.vocab_size, rows_per_step(tokens_per_step, context), context, 0, device)
        times = []
        for i in range(steps + 1):
            torch.cuda.synchronize() if device.type == "cuda" else None
            start = time.perf_counter()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                teacher(input_ids=ids, use_cache=False)
            torch.cuda.synchronize() if device.type == "cuda" else None
            times.append(time.perf_counter() - start)
        cells.append(f"{ids.numel() / statistics.median(times[1:]):,.0f} | | ")
    return "| teacher forward (the floor) | " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2")
    parser.add_argument("--contexts", type=int, nargs="+", default=[2048, 8192, 16384])
    parser.add_argument("--tokens-per-step", type=int, default=32768)
    parser.add_argument("--targets", nargs="+", default=list(t2r.MIXERS))
    parser.add_argument("--hybrid-every", type=int, default=10, help="0: no hybrid row")
    parser.add_argument("--hybrid-target", default="gsa", help="the mixer of the hybrid row")
    parser.add_argument("--window", type=int, default=0, help="window + sinks in every converted layer (0: none)")
    parser.add_argument("--sinks", type=int, default=4, help="sinks with --window")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--modes", nargs="+", choices=["eager", "compiled"], default=["eager"],
                        help="run every model eagerly, with regional torch.compile, or both (rows side by side)")
    parser.add_argument("--loss", choices=["next_token", "kl"], default="next_token",
                        help="kl: distillation from the source (bf16, frozen) with t2r's fused chunked KL")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    source = LlamaForCausalLM(LlamaConfig(**SHAPES[args.shape], attn_implementation="sdpa")).to(device)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    header = [f"Training step, {args.shape} shape (random weights), fp32 weights + bf16 autocast, fused AdamW, "
              f"{args.tokens_per_step} tokens per step, gradient checkpointing "
              f"{'on' if args.gradient_checkpointing else 'off'}; device: {name}",
              f"torch {torch.__version__}, transformers {transformers.__version__}; median of {args.steps} steps "
              f"after {args.warmup}; x source: against the source run the same way (eager or compiled)", "",
              "| model | " + " | ".join(f"{c // 1024}K tokens/s | x source | peak GiB" if c % 1024 == 0 else
                                    f"{c} tokens/s | x source | peak GiB" for c in args.contexts) + " |",
              "|---|" + "---|---|---|" * len(args.contexts)]
    rows, source_speed = [], {}
    out = args.out or Path(__file__).parent / "results" / (
        f"train_{name.replace(' ', '_')}{'_compiled' if 'compiled' in args.modes else ''}.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    runs = [(label, build, mode) for label, build in contenders(source, args.targets, args.hybrid_every,
                                                                args.hybrid_target, args.window, args.sinks)
            for mode in args.modes]
    loss_fn = next_token_loss
    if args.loss == "kl":
        teacher = copy.deepcopy(source).to(torch.bfloat16).eval().requires_grad_(False)
        loss_fn = distill_loss(teacher)
        header[0] += "; loss: KL to the source (bf16 teacher, fused chunked KL)"
        rows.append(teacher_floor(teacher, args.contexts, args.tokens_per_step, args.steps))
        print(rows[-1], flush=True)
    for label, build, mode in runs:
        compiled = mode == "compiled"
        model, cells = build(), []
        if compiled and model is source:
            model = copy.deepcopy(source)  # compiled in place: the conversions still start from the plain source
        if args.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        if compiled:
            compile_layers(model)
            torch._dynamo.utils.counters.clear()
        for context in args.contexts:
            try:
                check = check_against_eager(model, context) if compiled and args.loss == "next_token" else None
                ms, tokens, peak = training_steps(model, context, args.tokens_per_step, args.warmup, args.steps,
                                                  check_first=check, loss_fn=loss_fn)
            except torch.OutOfMemoryError:
                cells.append("OOM | | ")
                continue
            finally:
                gc.collect()
                torch.cuda.empty_cache() if device.type == "cuda" else None
            speed = tokens / ms * 1e3
            source_speed.setdefault((mode, context), speed)
            cells.append(f"{speed:,.0f} | {speed / source_speed[mode, context]:.2f} | "
                         + (f"{peak / 2**30:.1f}" if peak else "-"))
            print(f"{label}, {mode} {context}: {ms:.1f} ms/step, {speed:,.0f} tokens/s", flush=True)
        if compiled:
            breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
            print(f"{label}, compiled: {breaks} distinct graph breaks", flush=True)
        rows.append(f"| {label}{', compiled' if compiled else ''} | " + " | ".join(cells) + " |")
        if model is not source:
            del model
        out.write_text("\n".join(header + rows) + "\n\nCommand: python " + " ".join(sys.argv) + "\n")
    print("\n".join(header + rows))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
