"""A checkpoint directory belongs to one run at a time.

`RunLock` is an exclusive `flock` on `<dir>/.lock`, held by the main process for the whole run. The
kernel releases it when the process exits, however it exits, so a crashed run never blocks the next one;
the holder's pid, host and start time stay in the file until a clean release empties it, which is how the
next run tells a crash (a stale lock, reported and taken over) from a clean exit. (flock works on local
filesystems and NFSv4; a filesystem without locks makes `acquire` fail with a message.)

`claim` keeps a fresh run from writing over another run's results: it refuses a directory with
checkpoints or a final model unless `overwrite`, which deletes them before training starts.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Callable

from . import checkpoint
from .errors import RunDirError

LOCK_FILE = ".lock"
OUTPUTS = ("final", "metrics.jsonl", "final_metrics.json", "loss.png", "logs", "recipe.yaml", checkpoint.DAMAGED,
           "eval")
"""What a run writes into its directory besides `step-*` checkpoints (and `.tmp-*` leftovers)."""


class RunLock:
    def __init__(self, root: str | os.PathLike):
        self.path = Path(root) / LOCK_FILE
        self._fh = None

    def acquire(self) -> str | None:
        """Take the lock or raise RunDirError naming its holder; returns a note when a stale lock was taken over."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(_read(fh))
            fh.close()
            raise RunDirError(f"{self.path.parent} is in use by another run ({holder}; lock file {self.path}): "
                              "wait for it to finish, or give this run another checkpoint.dir") from None
        except OSError as err:
            fh.close()
            raise RunDirError(f"cannot lock {self.path} ({err}): put checkpoint.dir on a filesystem with file "
                              "locks (local disk or NFSv4)") from None
        previous = _read(fh)
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                             "command": " ".join(sys.argv)}))
        fh.flush()
        os.fsync(fh.fileno())
        self._fh = fh
        if previous:
            return (f"took over a stale lock on {self.path.parent}: {_describe(previous)} ended without releasing "
                    "it (crashed or killed)")
        return None

    def release(self) -> None:
        """Empty the lock file (a clean exit) and unlock. The file stays: removing it would let a run that
        opened it just before lock a deleted file while a third run creates and locks a new one."""
        if self._fh is None:
            return
        self._fh.seek(0)
        self._fh.truncate()
        self._fh.flush()
        fcntl.flock(self._fh, fcntl.LOCK_UN)
        self._fh.close()
        self._fh = None


def holder(root: str | os.PathLike) -> dict | None:
    """The run that holds (or, after a crash, last held) the lock on `root`, as written in the lock file."""
    try:
        return json.loads((Path(root) / LOCK_FILE).read_text() or "null")
    except (FileNotFoundError, ValueError):
        return None


def outputs(root: Path) -> list[Path]:
    """Another run's results in `root`: its checkpoints (damaged ones included) and the files in OUTPUTS."""
    if not root.is_dir():
        return []
    return checkpoint.checkpoints(root) + [root / name for name in OUTPUTS if (root / name).exists()]


def claim(root: Path, overwrite: bool, log: Callable[[str], None] = print) -> None:
    """Make `root` ready for a fresh run: refuse it while it holds another run's results, unless
    `overwrite`, which deletes them (and half-written `.tmp-*` saves) first."""
    found = outputs(root)
    if found and not overwrite:
        names = ", ".join(p.name + ("/" if p.is_dir() else "") for p in found[:5]) + (", ..." if len(found) > 5 else "")
        resume = "--resume continues it, " if checkpoint.checkpoints(root) else ""  # none: finished, keep_last 0
        raise RunDirError(f"{root} holds another run ({names}): {resume}--overwrite deletes it and starts afresh, "
                          "or set checkpoint.dir to a new directory")
    for path in found + sorted(root.glob(".tmp-*")):
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    if found:
        log(f"--overwrite: deleted the previous run in {root} ({len(found)} checkpoints and files)")


def _read(fh) -> dict | None:
    fh.seek(0)
    try:
        return json.loads(fh.read() or "null")
    except ValueError:
        return {"pid": "?", "host": "?", "started": None}


def _describe(info: dict | None) -> str:
    if not info:
        return "a run that is starting"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["started"])) if info.get("started") else "?"
    return f"pid {info.get('pid')} on {info.get('host')}, started {started}"
