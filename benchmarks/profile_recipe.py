"""Where a real run's steps go: `t2r finetune` of a recipe, unchanged, with torch.profiler over a few of its steps.

`profile_distill.py` times the distillation step alone on prepared batches; this runs the whole recipe (the data
stream tokenised in the run, the logging, the checkpoints) and profiles steps `--steps A:B` (after step A, up to
step B, global steps), so the two can be compared: what the real run adds to the step is the gap between them.
Prints, and writes to `--out`: the start-up line, tokens/s by stage (the median of the stage's steps after its
first two), and the profiler's tables (`profile_distill.profile_summary`): GPU time by kernel kind, launches,
the host's waits for the GPU.

    python benchmarks/profile_recipe.py recipes/frontier/smollm2-gdn-hybrid.yaml --steps 30:34 \\
        'data.path=.stage/data/train-00*.jsonl.gz' stages.distill.tokens=2621440 train.compile=true \\
        train.micro_batch_size=16 --out profile.md      # the run in a new temporary directory
    python benchmarks/profile_recipe.py tests/... --steps 1:2 ...        # any recipe; CPU: no kernel tables
    accelerate launch --config_file recipes/accelerate/ddp-2gpu.yaml benchmarks/profile_recipe.py R.yaml \
        checkpoint.dir=runs/profile-ddp --out 'profile-{rank}.md' ...    # each process profiles its own steps
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from t2r.train import finetune
from t2r.train.recipe import load_recipe
from t2r.train.startup import StartupClock

sys.path.insert(0, str(Path(__file__).parent))
from profile_distill import profile_summary  # noqa: E402


class StepProfiler:
    """A `finetune` callback: torch.profiler from the end of step `first` to the end of step `last`."""

    def __init__(self, first: int, last: int, micro_batches_per_step: int):
        self.first, self.last, self.per_step = first, last, micro_batches_per_step
        self.profiler, self.start, self.lines = None, 0.0, []

    def __call__(self, metrics: dict) -> None:
        from torch.profiler import ProfilerActivity, profile

        cuda = torch.cuda.is_available()
        if metrics["step"] == self.first:
            if cuda:
                torch.cuda.synchronize()
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            self.profiler = profile(activities=activities)
            self.profiler.__enter__()
            self.start = time.perf_counter()
        elif metrics["step"] == self.last and self.profiler is not None:
            if cuda:
                torch.cuda.synchronize()
            wall = (time.perf_counter() - self.start) * 1e3
            self.profiler.__exit__(None, None, None)
            steps = self.last - self.first
            self.lines = profile_summary(self.profiler, wall, self.per_step * steps,
                                         label=f"steps {self.first + 1}-{self.last} ({steps} steps)")
            self.profiler = None


def stage_rates(metrics_path: Path) -> list[str]:
    """tokens/s of each stage: the median of its steps after the first two (which compile and warm up)."""
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    by_stage: dict[str, list[float]] = {}
    for row in rows:
        if "tokens_per_s" in row:
            by_stage.setdefault(row.get("stage", "train"), []).append(row["tokens_per_s"])
    return [f"| {stage} | {len(rates)} | {statistics.median(rates[2:] or rates):,.0f} | {min(rates[2:] or rates):,.0f}"
            f" | {max(rates[2:] or rates):,.0f} |" for stage, rates in by_stage.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("config", help="the recipe")
    parser.add_argument("overrides", nargs="*", help="key=value, as `t2r finetune` takes them")
    parser.add_argument("--steps", default="30:34", help="A:B: profile after global step A up to step B")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_intermixed_args()
    first, last = (int(x) for x in args.steps.split(":"))
    overrides = list(args.overrides)
    rank, world = os.environ.get("RANK", "0"), int(os.environ.get("WORLD_SIZE", "1"))
    if not any(o.startswith("checkpoint.dir=") for o in overrides):  # a run directory of its own, never another's
        if world > 1:
            parser.error("under a launcher every process must name the same run directory: checkpoint.dir=DIR")
        overrides.append(f"checkpoint.dir={tempfile.mkdtemp(prefix='t2r-profile-')}")
    recipe = load_recipe(args.config, overrides)
    # the micro-batches this process runs in a step
    per_step = recipe.train.tokens_per_step // (recipe.train.micro_batch_size * recipe.data.seq_len * world)
    profiler = StepProfiler(first, last, per_step)
    finetune(recipe, callbacks=[profiler], clock=StartupClock(since_process_start=True))  # imports counted
    root = Path(recipe.checkpoint.dir)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    startup = root / "startup.json"
    lines = [f"# `{args.config}` {' '.join(overrides)}", "",
             f"Device: {device}; torch {torch.__version__}; process {rank} of {world}.", "",
             f"Start-up: {json.loads(startup.read_text()) if startup.is_file() else 'not written'}", "",
             "| stage | steps | median tokens/s | min | max |", "|---|---|---|---|---|",
             *stage_rates(root / "metrics.jsonl"), "", *profiler.lines, "",
             "Command: python " + " ".join(sys.argv)]
    text = "\n".join(lines) + "\n"
    if args.out:
        out = Path(str(args.out).replace("{rank}", rank))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    if rank == "0":
        print(text)


if __name__ == "__main__":
    main()
