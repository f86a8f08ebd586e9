"""How many CPU threads torch runs on in a `t2r` command: the cores other work leaves free.

torch starts one OpenMP thread per physical core. Where other processes keep cores busy, its threads wait for
each other at the end of every op (a descheduled thread holds up the rest): on 2 cores at load 3.5-5 a quick
look took 13 min against 1 min 35 s idle, and forwards of SmolLM2 over a few dozen tokens ran about x10 slower
with 2 threads than with 1. So, unless OMP_NUM_THREADS is set, a command takes the physical cores of its CPU set
less the CPUs other work keeps busy (rounded; at least 1): the smaller of the 1-minute load average and the busy
time of its CPUs over the last 0.15 s (`/proc/stat`). The load average alone lags by a minute: after
`pip install` in the same command line it still read ~1 on 2 idle cores, and the README's main job ran on one
thread. It is set in the environment before torch loads (the command
line's start-up imports no torch); a process that has imported torch already (a test calling `main`) keeps its
own setting. Imports nothing heavy.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

_lowered: str | None = None  # why `choose` lowered the thread count in this process, said once by `note`


def cpus() -> list[int]:
    """The CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def physical_cores(cpu_ids: list[int]) -> int:
    """Physical cores among `cpu_ids` (hyper-threads of one core counted once; all of them where Linux's topology
    files are not there)."""
    cores = set()
    for cpu in cpu_ids:
        try:
            cores.add(Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip())
        except OSError:
            return len(cpu_ids)
    return len(cores) or len(cpu_ids)


def free_threads(load: float, cpu_ids: list[int], cores: int) -> int:
    """Threads for a machine whose 1-minute load average is `load`: the CPUs it leaves free, rounded, within
    1 ... `cores`."""
    return max(1, min(cores, int(len(cpu_ids) - load + 0.5)))


def _cpu_times(cpu_ids: list[int]) -> dict[str, tuple[int, int]]:
    """{cpuN: (idle + iowait jiffies, all jiffies)} of `cpu_ids` from /proc/stat (empty where there is none)."""
    wanted, times = {f"cpu{i}" for i in cpu_ids}, {}
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        name, *values = line.split()
        if name in wanted and len(values) >= 5:
            jiffies = [int(v) for v in values[:8]]
            times[name] = (jiffies[3] + jiffies[4], sum(jiffies))
    return times


def busy_now(cpu_ids: list[int], seconds: float = 0.15) -> float | None:
    """How many of `cpu_ids` other work keeps busy now: their busy share over `seconds`, summed; None where
    /proc/stat cannot tell."""
    import time

    before = _cpu_times(cpu_ids)
    if not before:
        return None
    time.sleep(seconds)
    after, busy = _cpu_times(cpu_ids), 0.0
    for name, (idle, total) in before.items():
        if name in after and after[name][1] > total:
            busy += 1 - (after[name][0] - idle) / (after[name][1] - total)
    return busy


def choose(environ=os.environ) -> int | None:
    """Set OMP_NUM_THREADS for torch, lower than one per physical core when the machine is busy; the count set, or
    None (the user's OMP_NUM_THREADS, torch already imported, no load average, or an idle machine: torch's own
    default)."""
    global _lowered
    if "OMP_NUM_THREADS" in environ or "torch" in sys.modules or not hasattr(os, "getloadavg"):
        return None
    cpu_ids = cpus()
    cores, load = physical_cores(cpu_ids), os.getloadavg()[0]
    if free_threads(load, cpu_ids, cores) >= cores:
        return None
    now = busy_now(cpu_ids)  # sampled only where the load average says busy: an idle machine waits for nothing
    busy = load if now is None else min(load, now)
    threads = free_threads(busy, cpu_ids, cores)
    if threads >= cores:
        return None
    environ["OMP_NUM_THREADS"] = str(threads)
    _lowered = (f"{threads} CPU thread{'s' if threads > 1 else ''} for torch, not {cores}: the machine is busy (load "
                f"average {load:.1f} on {len(cpu_ids)} CPUs"
                + (f", {now:.1f} of them busy now" if now is not None else "")
                + "); OMP_NUM_THREADS=N sets the count")
    return threads


def note() -> None:
    """Say on stderr, once, that `choose` lowered the thread count (a command calls this once its arguments are
    checked, before the long work)."""
    global _lowered
    if _lowered:
        print(f"note: {_lowered}", file=sys.stderr, flush=True)
        _lowered = None
