"""Where a run's start goes: seconds from launch to the end of the first optimizer step, part by part
(imports, data check, model load, calibration, conversion, placement, the held-out loss before training,
first batch, first step), printed as one line after the first step and written to `startup.json` in the run
directory."""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from pathlib import Path


def process_age() -> float | None:
    """Seconds since this process began (Linux: /proc/self/stat's start time against /proc/uptime, 10 ms
    ticks), or None where the system does not say."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            started_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22, after the command name
            return max(0.0, float(uptime.read().split()[0]) - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


class StartupClock:
    """`with clock.part(name): ...` adds the block's seconds to `name`, less those of parts inside it; `done()`
    closes the clock (after the first optimizer step); the time in no part is reported as `other`.

    `since_process_start`: the clock starts when the process did (the command line: the interpreter's start
    and the imports of torch, transformers and t2r, seconds on any machine, are then the part `imports`), not
    when the clock is made (a `finetune()` called from a notebook)."""

    def __init__(self, since_process_start: bool = False):
        self.launch = time.perf_counter()
        self.parts: dict[str, float] = {}
        age = process_age() if since_process_start else None
        if age is not None:
            self.launch -= age
            self.parts["imports"] = age
        self.total: float | None = None
        self._nested: list[float] = []  # per open part: the seconds of the parts inside it

    @contextmanager
    def part(self, name: str):
        start = time.perf_counter()
        self._nested.append(0.0)
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            inner = self._nested.pop()
            if self._nested:
                self._nested[-1] += elapsed
            if self.total is None:
                self.parts[name] = self.parts.get(name, 0.0) + elapsed - inner

    def add(self, name: str, seconds: float) -> None:
        if self.total is None:
            self.parts[name] = self.parts.get(name, 0.0) + seconds

    def timed_batches(self, batches):
        """`batches`, the seconds spent fetching each one counted as `first batches` while the clock is open."""
        it = iter(batches)
        while True:
            start = time.perf_counter()
            batch = next(it, None)
            self.add("first batches", time.perf_counter() - start)
            if batch is None:
                return
            yield batch

    @property
    def open(self) -> bool:
        return self.total is None

    def done(self) -> None:
        if self.total is None:
            self.total = time.perf_counter() - self.launch
            self.parts["other"] = max(0.0, self.total - sum(self.parts.values()))

    def line(self) -> str:
        parts = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.parts.items())
        return f"start-up: {self.total:.1f} s from launch to the end of the first step ({parts})"

    def write(self, directory: str | Path) -> None:
        record = {"total_s": round(self.total, 3), **{f"{k}_s": round(v, 3) for k, v in self.parts.items()}}
        (Path(directory) / "startup.json").write_text(json.dumps(record, indent=2) + "\n")
