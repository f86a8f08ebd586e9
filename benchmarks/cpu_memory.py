"""Time and peak host memory of SmolLM2 against its converted models on CPU, side by side in one run.

    python benchmarks/cpu_memory.py                      # train step as the CPU recipe trains + 2K forward
    python benchmarks/cpu_memory.py --targets source,gsa --modes train --steps 2
    python benchmarks/cpu_memory.py --targets source,gsa --modes train --checkpointing off   # without it

Each model runs in its own fresh process (peak RSS, `ru_maxrss`, is per process): load the source in fp32,
convert (or not), then (a) `--steps` AdamW training steps on the first micro-batch of `--recipe` (default
`recipes/smollm2-gsa-cpu.yaml`: 4 packed rows of 256 tokens of `data/train.jsonl`, documents kept apart, fp32,
all parameters, gradient checkpointing as the recipe says or as `--checkpointing on|off` sets it), and (b) in
another process,
one no-grad forward over `--forward` tokens, as `t2r eval` scores perplexity. Reported: seconds per step (the
median after a first, warm-up step), the process's CPU seconds per step (with OMP_NUM_THREADS=1, a measure that
another busy process on the same cores barely moves, unlike the wall time), peak RSS, and the ratio of each to
the source's. Torch threads: as torch sets them.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time


def child(args) -> dict:
    import torch

    import t2r
    from t2r.sources import load_source

    if args.op_recompute == "off":  # the ops keep their activations for backward instead of recomputing them
        import t2r.ops.utils

        t2r.ops.utils.saved_tensors_managed = lambda: True
    torch.manual_seed(0)
    model, tokenizer = load_source("smollm2", dtype=torch.float32)
    if args.target != "source":
        model = t2r.convert(model, args.target, copy=False)  # as finetune converts: no second copy
    rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    vocab = model.config.vocab_size
    times, cpu_times = [], []
    if args.mode == "train":
        from t2r.train import load_recipe
        from t2r.train.batches import packed_loader

        recipe = load_recipe(args.recipe)
        batch = next(iter(packed_loader(recipe, tokenizer)))
        if {"recipe": recipe.train.gradient_checkpointing, "on": True, "off": False}[args.checkpointing]:
            model.gradient_checkpointing_enable()
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
        for _ in range(args.steps):
            start, cpu = time.perf_counter(), time.process_time()
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - start)
            cpu_times.append(time.process_time() - cpu)
    else:
        model.eval()
        ids = torch.randint(3, vocab, (1, args.forward), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            for _ in range(args.steps):
                start, cpu = time.perf_counter(), time.process_time()
                model(input_ids=ids, use_cache=False)
                times.append(time.perf_counter() - start)
                cpu_times.append(time.process_time() - cpu)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    steady = times[1:] or times
    return {"target": args.target, "mode": args.mode, "s_per_step": statistics.median(steady),
            "cpu_s_per_step": statistics.median(cpu_times[1:] or cpu_times),
            "first_s": times[0], "peak_gib": peak, "loaded_gib": rss_loaded}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", default="source,gsa,gla,retnet,fox")
    parser.add_argument("--modes", default="train,forward")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--recipe", default="recipes/smollm2-gsa-cpu.yaml", help="whose first micro-batch trains")
    parser.add_argument("--forward", type=int, default=2048)
    parser.add_argument("--checkpointing", choices=("recipe", "on", "off"), default="recipe",
                        help="gradient checkpointing of the train steps: as the recipe says, or on / off")
    parser.add_argument("--op-recompute", choices=("on", "off"), default="on",
                        help="off: the chunkwise ops keep what backward needs instead of recomputing their forward")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    rows = []
    for mode in args.modes.split(","):
        for target in args.targets.split(","):
            cmd = [sys.executable, __file__, "--child", "--target", target, "--mode", mode,
                   "--steps", str(args.steps), "--recipe", args.recipe, "--forward", str(args.forward),
                   "--checkpointing", args.checkpointing, "--op-recompute", args.op_recompute]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
            print(rows[-1], file=sys.stderr, flush=True)
    import torch

    print(f"\nCPU, {torch.get_num_threads()} torch threads, fp32; train: first micro-batch of {args.recipe}, AdamW, "
          f"all parameters, gradient checkpointing {args.checkpointing}, op recompute {args.op_recompute}; "
          f"forward: 1 x {args.forward} tokens, no grad\n")
    print("| model | mode | s / step | x source | CPU s / step | x source | peak RSS GiB | x source | "
          "RSS after load GiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        base = next(r for r in rows if r["mode"] == row["mode"] and r["target"] == "source") \
            if any(r["target"] == "source" and r["mode"] == row["mode"] for r in rows) else row
        print(f"| {row['target']} | {row['mode']} | {row['s_per_step']:.2f} "
              f"| {row['s_per_step'] / base['s_per_step']:.2f} | {row['cpu_s_per_step']:.2f} "
              f"| {row['cpu_s_per_step'] / base['cpu_s_per_step']:.2f} | {row['peak_gib']:.2f} "
              f"| {row['peak_gib'] / base['peak_gib']:.2f} | {row['loaded_gib']:.2f} |")


if __name__ == "__main__":
    main()
