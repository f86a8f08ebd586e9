"""SIGTERM (a scheduler's stop, `kill`) and SIGINT (Ctrl-C) end a run cleanly: the step under way finishes, a
checkpoint of it is written, and the run exits with a message saying how to continue (exit status 128 + the
signal's number, as a shell reports a process the signal ended). A second signal stops at once, as without t2r,
unless it is the first one again within `REPEAT_S`: GNU `timeout` sends its signal to the command and then to
the command's process group, so the command gets it twice (an H100 run under `timeout -s INT` stopped at once,
without its checkpoint, when the second came after the first was handled).
"""

from __future__ import annotations

import signal
import sys
import threading
import time

from .errors import RunError

HANDLED = (signal.SIGTERM, signal.SIGINT)
REPEAT_S = 1.0
"""The same signal again within this many seconds of the first is the same stop, delivered twice."""
_active: list[StopOnSignal] = []


def active() -> StopOnSignal | None:
    """The innermost `StopOnSignal` block around this call (the training loop asks it after every step)."""
    return _active[-1] if _active else None


class Stopped(RunError):
    """The run stopped on a signal after writing a checkpoint."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum


class StopOnSignal:
    """`with StopOnSignal() as stop:` ... `stop.signum` is the first SIGTERM / SIGINT received (None before); a second
    one gets the handler that was there before (Python's: KeyboardInterrupt for SIGINT, the default end for
    SIGTERM). Outside the main thread (where handlers cannot be set) it does nothing."""

    def __init__(self, log=lambda text: print(text, file=sys.stderr, flush=True), clock=time.monotonic):
        self.signum, self.log, self._previous, self.clock, self._at = None, log, {}, clock, 0.0

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in HANDLED}
        _active.append(self)
        return self

    def __exit__(self, *exc):
        self._restore()
        if self in _active:
            _active.remove(self)

    def _restore(self):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _handle(self, signum, frame):
        if self.signum is not None:  # the second: stop now, unless it is the first delivered twice
            if signum == self.signum and self.clock() - self._at < REPEAT_S:
                return
            self._restore()
            signal.raise_signal(signum)
            return
        self.signum, self._at = signum, self.clock()
        self.log(f"received {signal.Signals(signum).name}: finishing this step, then writing a checkpoint "
                 f"(send it again to stop at once)")
