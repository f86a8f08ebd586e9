"""Two runs of the same recipe side by side: their losses step by step and their final weights (issue 39).

A run stopped (SIGTERM, or one rank killed) and resumed should end where an uninterrupted run of the same steps
ends: bit-identical where every kernel is deterministic, else within the two runs' own rounding. Prints the
steps where the logged losses differ, the largest difference, and each final tensor's largest difference.

    python benchmarks/repro/compare_runs.py runs/ddp runs/ddp-cut
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import load_file


def losses(run: Path) -> dict[int, float]:
    """The training loss of each step of `run`'s metrics.jsonl (the last row of a step wins: a resumed run
    logs again the steps after its checkpoint)."""
    rows = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "loss" in row and row.get("loss") is not None and "held_out_loss" not in row:
            rows[row["step"]] = row["loss"]
    return rows


def weights(run: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for file in sorted((run / "final").glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    return tensors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    args = parser.parse_args()
    la, lb = losses(args.a), losses(args.b)
    common = sorted(set(la) & set(lb))
    differ = [s for s in common if la[s] != lb[s]]
    print(f"losses: {len(common)} common steps, {len(differ)} differ"
          + (f" (first at step {differ[0]}; largest |difference| "
             f"{max(abs(la[s] - lb[s]) for s in differ):.3g})" if differ else " (bit-identical)"))
    for s in (differ if len(differ) <= 8 else differ[:5] + differ[-3:]):
        print(f"  step {s}: {la[s]:.6f} vs {lb[s]:.6f}")
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
