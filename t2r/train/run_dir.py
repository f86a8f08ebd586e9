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
BEFORE_FIRST_CHECKPOINT = (LOCK_FILE, "recipe.yaml", "metrics.jsonl", "startup.json", "logs")
"""All a run writes into its directory before its first checkpoint (besides a half-written `.tmp-*` save)."""


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
        return _holder_info((Path(root) / LOCK_FILE).read_text())
    except FileNotFoundError:
        return None


def outputs(root: Path) -> list[Path]:
    """Another run's results in `root`: its checkpoints (damaged ones included) and the files in OUTPUTS."""
    if not root.is_dir():
        return []
    return checkpoint.checkpoints(root) + [root / name for name in OUTPUTS if (root / name).exists()]


def not_from_a_started_run(root: Path) -> list[str]:
    """The entries of `root` that a run stopped before its first checkpoint would not have written."""
    return sorted(p.name + ("/" if p.is_dir() else "") for p in root.iterdir()
                  if p.name not in BEFORE_FIRST_CHECKPOINT and not p.name.startswith(".tmp-"))


def nearby_runs(root: Path, limit: int = 5) -> str:
    """The runs beside `root` (directories of its parent with checkpoints or a final model), as a phrase."""
    parent = root.parent
    found = [d for d in sorted(parent.iterdir()) if d != root and d.is_dir()
             and (checkpoint.checkpoints(d) or (d / "final").is_dir())] if parent.is_dir() else []
    if not found:
        return f"no run in {parent} has a checkpoint"
    names = ", ".join(str(d) for d in found[:limit]) + (f" (and {len(found) - limit} more)" if len(found) > limit
                                                        else "")
    return f"runs with checkpoints in {parent}: {names}"


def claim(root: Path, overwrite: bool, log: Callable[[str], None] = print) -> None:
    """Make `root` ready for a fresh run: refuse it while it holds another run's results, unless
    `overwrite`, which deletes them (and half-written `.tmp-*` saves) first."""
    found = outputs(root)
    if found and not overwrite:
        names = ", ".join(p.name + ("/" if p.is_dir() else "") for p in found[:5]) + (", ..." if len(found) > 5 else "")
        resume = "--resume continues it, " if checkpoint.checkpoints(root) else ""  # none: finished, keep_last 0
        raise RunDirError(f"{root} holds another run ({names}): {resume}--overwrite deletes it and starts afresh, "
                          "or set checkpoint.dir to a new directory")
    doomed = found + sorted(root.glob(".tmp-*"))
    links = [p for p in doomed if p.is_symlink()]
    if links:
        raise RunDirError(f"--overwrite: {links[0]} is a symbolic link (to {os.readlink(links[0])}); t2r deletes "
                          "only what it wrote, never through a link: remove the link (rm it, the target stays) or "
                          "set checkpoint.dir to a new directory; nothing was deleted")
    for path in doomed:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    if found:
        log(f"--overwrite: deleted the previous run in {root} ({len(found)} checkpoints and files)")


def _read(fh) -> dict | None:
    fh.seek(0)
    return _holder_info(fh.read())


def _holder_info(text: str) -> dict | None:
    """The lock file's record: None when empty (released cleanly); an unknown holder for anything that is not
    the JSON object t2r writes (a torn write, or a file edited by hand)."""
    try:
        info = json.loads(text or "null")
    except ValueError:
        info = text
    if info is None or isinstance(info, dict):
        return info
    return {"pid": "?", "host": "?", "started": None}


def _describe(info: dict | None) -> str:
    if not info:
        return "a run that is starting"
    started = info.get("started")
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "?"
    return f"pid {info.get('pid')} on {info.get('host')}, started {started}"
