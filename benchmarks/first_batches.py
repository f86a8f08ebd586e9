"""How long a run's first micro-batch waits for the reader process (`data.reader=process`, auto beside a GPU): the
`t2r finetune` command line on a tiny model, whose loading takes a fraction of a second, so that nothing hides the
reader server's start. Each checkout given runs the same command in a fresh process, in turn.

    python benchmarks/first_batches.py                               # this checkout
    git worktree add /tmp/before <commit>
    python benchmarks/first_batches.py --checkouts /tmp/before,. --repeats 2

Prints the start-up line's parts (imports, first batches, the whole start-up) as a markdown table.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.helpers.models import save_tiny_source  # noqa: E402
from tests.helpers.recipes import recipe, write_corpus  # noqa: E402


def startup_parts(checkout: Path, config: Path, run_dir: Path) -> dict[str, float]:
    """The start-up line's seconds by part, of one fresh `t2r finetune` from `checkout`."""
    shutil.rmtree(run_dir, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(checkout.resolve())}
    done = subprocess.run([sys.executable, "-m", "t2r.cli", "finetune", "--config", str(config),
                           "data.reader=process"], env=env, capture_output=True, text=True,
                          cwd=run_dir.parent)  # not a checkout: `python -m` puts the working directory first
    line = next((x for x in (done.stdout + done.stderr).splitlines() if x.startswith("start-up:")), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"{checkout}: t2r finetune failed (rc {done.returncode}):\n{done.stderr[-2000:]}")
    parts = {name.strip(): float(s) for name, s in re.findall(r"([a-z -]+?) ([\d.]+) s", line.split("(", 1)[1])}
    parts["start-up"] = float(re.search(r"start-up: ([\d.]+) s", line).group(1))
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkouts", default=".", help="comma-separated repository roots to run t2r from")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        source = save_tiny_source(tmp / "source")
        recipe(tmp, source, write_corpus(tmp / "train.jsonl"))
        print("| checkout | imports s | first batches s | start-up s |\n|---|---|---|---|")
        for _ in range(args.repeats):
            for checkout in args.checkouts.split(","):
                parts = startup_parts(Path(checkout), tmp / "run.yaml", tmp / "run")
                print(f"| {checkout} | {parts.get('imports', 0):.1f} | {parts.get('first batches', 0):.1f} | "
                      f"{parts['start-up']:.1f} |")


if __name__ == "__main__":
    main()
