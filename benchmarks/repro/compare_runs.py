"""Two runs of the same recipe side by side: their losses step by step and their final weights (issue 39).

A run stopped (SIGTERM, or one rank killed) and resumed should end where an uninterrupted run of the same steps
ends: bit-identical where every kernel is deterministic, else within the two runs' own rounding. Prints the
steps where the logged losses differ, the largest difference, and each final tensor's largest difference.

    python benchmarks/repro/compare_runs.py runs/ddp runs/ddp-cut --cut 61   # mean difference before/after step 61
    python benchmarks/repro/compare_runs.py runs/one runs/ddp --speed --stage distill   # tokens/s of b over a

A directory holding `metrics.jsonl` but no `final/` (results kept without weights) compares its losses only.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from safetensors.torch import load_file


def step_rows(run: Path, key: str) -> dict[int, float]:
    """`key` (loss, tokens_per_s) of each step of `run`'s metrics.jsonl, or of `run` itself where it is that file
    (the last row of a step wins: a resumed run logs again the steps after its checkpoint)."""
    rows = {}
    path = run if run.is_file() else run / "metrics.jsonl"
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row.get(key) is not None and "held_out_loss" not in row:
            rows[row["step"]] = row[key]
    return rows


def mean_difference(a: dict, b: dict, steps) -> str:
    diffs = [abs(a[s] - b[s]) for s in steps if s in a and s in b]
    return f"mean {statistics.fmean(diffs):.3g}, largest {max(diffs):.3g} over {len(diffs)} steps" if diffs else "none"


def steady_steps(run: Path, stage: str | None, checkpoint_every: int) -> list[int]:
    """The steps of `stage` (None: of every stage) from the stage's third on (the first two compile and warm up),
    checkpoint steps left out (a save lands in their time)."""
    path = run if run.is_file() else run / "metrics.jsonl"
    by_stage: dict = {}
    for row in map(json.loads, path.read_text().splitlines()):
        if "tokens_per_s" in row and (stage is None or row.get("stage") == stage):
            by_stage.setdefault(row.get("stage"), set()).add(row["step"])
    return [s for steps in by_stage.values() for s in sorted(steps)[2:] if s % checkpoint_every]


def stage_medians(run: Path) -> str:
    """Median tokens/s of each stage of `run` and its quartiles, over its steps from the third on."""
    path = run if run.is_file() else run / "metrics.jsonl"
    by_stage: dict = {}
    for row in map(json.loads, path.read_text().splitlines()):
        if "tokens_per_s" in row:
            by_stage.setdefault(row.get("stage", "train"), {})[row["step"]] = row["tokens_per_s"]
    parts = []
    for stage, rates in by_stage.items():
        steady = [rates[s] for s in sorted(rates)[2:]] or list(rates.values())
        low, _, high = statistics.quantiles(steady, n=4) if len(steady) > 1 else (steady[0],) * 3
        parts.append(f"{stage} {statistics.median(steady):,.0f} ({low:,.0f}-{high:,.0f})")
    return ", ".join(parts)


def weights(run: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for file in sorted((run / "final").glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    return tensors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--cut", type=int, default=None,
                        help="the step b was stopped after: |loss difference| before it and after it apart")
    parser.add_argument("--speed", action="store_true",
                        help="tokens/s of b over a on the same steps (the third of each stage on): median, quartiles")
    parser.add_argument("--stage", default=None, help="--speed over this stage's steps only (e.g. distill)")
    parser.add_argument("--checkpoint-every", type=int, default=50, help="steps whose checkpoint --speed leaves out")
    args = parser.parse_args()
    la, lb = step_rows(args.a, "loss"), step_rows(args.b, "loss")
    common = sorted(set(la) & set(lb))
    differ = [s for s in common if la[s] != lb[s]]
    print(f"losses: {len(common)} common steps, {len(differ)} differ"
          + (f" (first at step {differ[0]}; largest |difference| "
             f"{max(abs(la[s] - lb[s]) for s in differ):.3g})" if differ else " (bit-identical)"))
    for s in (differ if len(differ) <= 8 else differ[:5] + differ[-3:]):
        print(f"  step {s}: {la[s]:.6f} vs {lb[s]:.6f}")
    if args.cut is not None:
        print(f"|loss difference| up to step {args.cut}: {mean_difference(la, lb, range(1, args.cut + 1))}; "
              f"after it: {mean_difference(la, lb, range(args.cut + 1, max(common, default=0) + 1))}")
    if args.speed:
        ta, tb = step_rows(args.a, "tokens_per_s"), step_rows(args.b, "tokens_per_s")
        ratios = [tb[s] / ta[s] for s in steady_steps(args.a, args.stage, args.checkpoint_every)
                  if s in tb]
        quartiles = statistics.quantiles(ratios, n=4)
        print(f"tokens/s of b over a: median {statistics.median(ratios):.2f} (quartiles {quartiles[0]:.2f}-"
              f"{quartiles[2]:.2f}) over {len(ratios)} steps")
        print(f"median tokens/s by stage (quartiles): a {stage_medians(args.a)}; b {stage_medians(args.b)}")
    if not (args.a / "final").is_dir() or not (args.b / "final").is_dir():
        return
    wa, wb = weights(args.a), weights(args.b)
    if not wa or not wb:
        print("final weights: missing in", " and ".join(str(r) for r, w in ((args.a, wa), (args.b, wb)) if not w))
        return
    if set(wa) != set(wb):
        print(f"final weights: tensors only in {args.a}: {sorted(set(wa) - set(wb))}; "
              f"only in {args.b}: {sorted(set(wb) - set(wa))}")
        wa, wb = ({k: w[k] for k in set(wa) & set(wb)} for w in (wa, wb))
    diffs = {k: (wa[k].float() - wb[k].float()).abs().max().item() for k in wa}
    scale = max(wa[k].float().abs().max().item() for k in wa)
    worst = max(diffs, key=diffs.get)
    same = sum(torch.equal(wa[k], wb[k]) for k in wa)
    print(f"final weights: {same} of {len(wa)} tensors bit-identical; largest |difference| {diffs[worst]:.3g} "
          f"({worst}; largest |weight| {scale:.3g})")


if __name__ == "__main__":
    main()
