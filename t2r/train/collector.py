"""Python's cyclic garbage collector run by the step loop instead of by allocation counts.

Left to itself, Python collects whenever its allocation counters say, mid-step: a full collection took up to
263 ms in a `t2r finetune` of SmolLM2 on a CPU (524K tracked objects, more with torch.compile's; `python
benchmarks/gc_pauses.py`, benchmarks/results/gc_pauses_cpu_2026-11-28.md), longer than a GPU's micro-batch. On
one GPU such a pause leaves the card idle once its queue drains; under DDP it holds every other rank at the next
all-reduce too, and each rank's pauses fall at other times, so all ranks wait for all of them.

`StepCollector` turns automatic collection off for a run of steps and collects at one point of every optimizer
step, the same on every rank: after the first step (set-up and compilation done) everything, and what survives is
frozen (`gc.freeze`: never scanned again in the run); after each later step the young generations, and
everything every `FULL_EVERY` steps. The step loop calls it after the step's last backward is queued, while the
GPU still has that backward to run. (On Python 3.14's incremental collector a young collection also scans an
increment of the old objects; on free-threaded builds every collection is a full one.)"""

from __future__ import annotations

import gc

FULL_EVERY = 100
"""Optimizer steps between full collections (the young generations are collected after every step)."""


class StepCollector:
    """A context for one run of steps: automatic collection off inside it (as it was after), and what outlived
    its first step frozen out of collections until its end, unless a caller had frozen objects itself (then its
    freeze is left alone). `step_done(step)` collects. Inactive (`active=False`): Python's own collection."""

    def __init__(self, active: bool = True, full_every: int = FULL_EVERY):
        self.active, self.full_every = active, full_every
        self.was_enabled, self.froze, self.steps = gc.isenabled(), False, 0  # the state __enter__ found

    def __enter__(self) -> StepCollector:
        if self.active:
            self.was_enabled = gc.isenabled()
            gc.disable()
        return self

    def step_done(self, step: int) -> None:
        """After optimizer step `step` (global, 1-based) is queued: the young generations, or all every
        `full_every` steps and after the run's first step, whose survivors are then frozen."""
        if not self.active:
            return
        self.steps += 1
        if self.steps == 1:
            gc.collect()  # the set-up's and the first step's garbage, before what lives on is frozen
            if gc.get_freeze_count() == 0:
                gc.freeze()
                self.froze = True
        else:
            gc.collect(2 if step % self.full_every == 0 else 1)

    def __exit__(self, *exc) -> None:
        if self.active:
            if self.froze:
                gc.unfreeze()
            if self.was_enabled:
                gc.enable()
