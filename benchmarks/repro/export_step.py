"""Write a run's newest checkpoint out as `<run>/final`, for a run cut short before its end (a device session
that ran out): `t2r export` (`t2r.train.export.export_checkpoint`) with the output the earlier results name.

    python benchmarks/repro/export_step.py runs/smollm2-gdn-hybrid [--step step-00000180-distill]
    t2r export runs/smollm2-gdn-hybrid --out runs/smollm2-gdn-hybrid/final        # the same
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--step", default=None, help="checkpoint directory name (default: the newest)")
    args = parser.parse_args()
    from t2r.train.export import export_checkpoint

    step = args.run / args.step if args.step else sorted(args.run.glob("step-*"))[-1]
    print(f"{step} -> {export_checkpoint(step, args.run / 'final', made_by='benchmarks/repro/export_step.py')}")


if __name__ == "__main__":
    main()
