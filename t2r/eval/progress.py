"""Progress lines for output that is not a terminal (a log file, a pipe), where tqdm draws no bar."""

from __future__ import annotations

import sys
import time


def note(message: str) -> None:
    """Print `message` (flushed) when stdout is not a terminal; on a terminal the bars show progress."""
    if not sys.stdout.isatty():
        print(message, flush=True)


class Step:
    """`with Step("ppl gsa"):` notes `ppl gsa: 6.2 s` when the block ends (off a terminal)."""

    def __init__(self, label: str):
        self.label = label

    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            note(f"  {self.label}: {time.perf_counter() - self.start:.1f} s")
