"""Python's cyclic garbage collector run by the step loop instead of by allocation counts.

Left to itself, Python collects whenever its allocation counters say, mid-step: a full collection took 130-260 ms
in a `t2r finetune` of SmolLM2 on a CPU (524K tracked objects; more with torch.compile's), longer than a GPU's
micro-batch. On one GPU such a pause leaves the card idle once its queue drains; under DDP it holds every other
rank at the next all-reduce too, and each rank's pauses fall at other times, so all ranks wait for all of them.

`StepCollector` freezes what the set-up made (`gc.freeze`: never scanned again), turns automatic collection
off, and collects at one point of every optimizer step, the same on every rank: the young generations each step,
everything every `FULL_EVERY` steps. The step loop calls it after the step's last backward is queued, while the
GPU still has that backward to run."""

from __future__ import annotations

import gc

FULL_EVERY = 100
"""Optimizer steps between full collections (the young generations are collected after every step)."""


class StepCollector:
    """A context for one run of steps: automatic collection off inside it (as it was after), the objects that
    existed at its start frozen out of collections until its end. `step_done(step)` collects. Inactive
    (`active=False`): Python's own collection, nothing changed."""

    def __init__(self, active: bool = True, full_every: int = FULL_EVERY):
        self.active, self.full_every = active, full_every
        self.was_enabled = gc.isenabled()

    def __enter__(self) -> StepCollector:
        if self.active:
            self.was_enabled = gc.isenabled()
            gc.freeze()
            gc.disable()
        return self

    def step_done(self, step: int) -> None:
        """After optimizer step `step` (1-based) is queued: the young generations, or all every `full_every`."""
        if self.active:
            gc.collect(2 if step % self.full_every == 0 else 1)

    def __exit__(self, *exc) -> None:
        if self.active:
            gc.unfreeze()
            if self.was_enabled:
                gc.enable()
