"""Joining the process group the environment names (`WORLD_SIZE`, `RANK`, `MASTER_ADDR`, ... as `accelerate
launch` and `torchrun` set them), with a deadline: variables set by hand without the other processes (or copied
from another job) would otherwise wait for them without end. Past `$T2R_RENDEZVOUS_TIMEOUT` seconds (default
300) the process ends with one line naming the variables and exit code 2; nothing is written before it joins.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Callable, TypeVar

ENV = "T2R_RENDEZVOUS_TIMEOUT"
DEFAULT_SECONDS = 300.0
VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
T = TypeVar("T")


def deadline() -> float:
    """Seconds to wait for the other processes (`$T2R_RENDEZVOUS_TIMEOUT`), or a ValueError naming the variable."""
    text = os.environ.get(ENV, "").strip()
    try:
        seconds = float(text) if text else DEFAULT_SECONDS
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds < float("inf"):
        raise ValueError(f"{ENV}={text!r}: give the seconds to wait for the other processes, e.g. {ENV}=600")
    return seconds


def joined(join: Callable[[], T]) -> T:
    """`join()` (accelerate's `PartialState`, which forms the process group), ended in one line when the other
    processes have not joined within `deadline()` seconds; with one process, simply `join()`."""
    world = os.environ.get("WORLD_SIZE", "1").strip() or "1"
    if not world.isdigit() or int(world) <= 1:
        return join()
    seconds = deadline()
    done = threading.Event()

    def give_up() -> None:
        if done.is_set():
            return
        named = " ".join(f"{name}={os.environ[name]}" for name in VARIABLES if name in os.environ)
        sys.stderr.write(f"t2r: error: the other {int(world) - 1} process(es) did not join within {seconds:g} s "
                         f"({named}): start every process with a launcher (accelerate launch, torchrun), or unset "
                         f"WORLD_SIZE and RANK to train in one process ({ENV} sets the wait)\n")
        sys.stderr.flush()
        os._exit(2)  # the rendezvous blocks inside torch: nothing else ends it

    timer = threading.Timer(seconds, give_up)
    timer.daemon = True
    timer.start()
    try:
        return join()
    finally:
        done.set()
        timer.cancel()
