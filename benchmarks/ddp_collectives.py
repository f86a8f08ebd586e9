"""The collectives a data-parallel run makes, counted: each rank runs `finetune` on a recipe under torch.profiler
and rank 0 prints how many collectives of each kind and input shape ran (gloo on the CPU, NCCL on GPUs). What made
the ranks of a two-H100 run meet (`benchmarks/results/reader_ddp_resume_H100x2_2026-11-27/`) is read from this.

    torchrun --nproc-per-node 2 benchmarks/ddp_collectives.py RECIPE.yaml [section.field=value ...]

A tiny recipe for the CPU: `python -c "from tests.helpers.recipes import recipe; ..."` as benchmarks/first_batches.py
makes one. Each rank writes its own run directory (`checkpoint.dir` + `-rank<N>`), overwritten.
"""

from __future__ import annotations

import collections
import os
import sys

sys.argv[0] = "t2r"  # as the command line: `import t2r` skips its eager imports

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from t2r.train import finetune, load_recipe  # noqa: E402

COLLECTIVE_WORDS = ("all_reduce", "allreduce", "broadcast", "all_gather", "allgather", "reduce_scatter", "barrier")


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    rank = os.environ.get("RANK", "0")
    recipe = load_recipe(sys.argv[1], sys.argv[2:])
    recipe = load_recipe(sys.argv[1], [*sys.argv[2:], f"checkpoint.dir={recipe.checkpoint.dir}-rank{rank}"])
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        finetune(recipe, overwrite=True)
    if rank != "0":
        return
    counts = collections.Counter((event.name, str(event.input_shapes)) for event in prof.events()
                                 if any(word in event.name.lower() for word in COLLECTIVE_WORDS))
    print(f"collectives of rank 0 over {recipe.train.max_steps or '?'} steps (torch {torch.__version__})")
    print("| count | collective | input shapes |\n|---|---|---|")
    for (name, shapes), count in counts.most_common():
        print(f"| {count} | `{name}` | {shapes} |")


if __name__ == "__main__":
    main()
