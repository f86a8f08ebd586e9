"""Python's garbage collections in a `t2r` command: how many of each generation, how long they took, and how
many objects the process tracked at its end (what `t2r.train.collector` is about).

    python benchmarks/gc_pauses.py finetune --config recipes/smollm2-gsa-cpu.yaml data.path=train.jsonl \\
        train.max_steps=6 checkpoint.dir=/tmp/gc-run --overwrite
    python benchmarks/gc_pauses.py finetune ... train.collect_garbage=false     # Python's own collection

The rest of the command line is `t2r`'s; the table goes to stderr when the command ends.
"""

import atexit
import gc
import runpy
import sys
import time

pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
_started = [0.0]


def _timed(phase: str, info: dict) -> None:
    if phase == "start":
        _started[0] = time.perf_counter()
    else:
        pauses[info["generation"]].append(time.perf_counter() - _started[0])


def report() -> None:
    print("| generation | collections | total ms | longest ms |\n|---|---|---|---|", file=sys.stderr)
    for generation, took in pauses.items():
        print(f"| {generation} | {len(took)} | {sum(took) * 1e3:.0f} | {max(took, default=0) * 1e3:.1f} |",
              file=sys.stderr)
    print(f"objects tracked at the end: {len(gc.get_objects()):,}", file=sys.stderr)


gc.callbacks.append(_timed)
atexit.register(report)
runpy.run_module("t2r.cli", run_name="__main__", alter_sys=True)
