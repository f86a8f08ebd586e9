"""Training checkpoints that are never half-written: each is built in a hidden temporary
directory (accelerate's `save_state`: model, optimizer, scheduler, RNG states) with the
trainer state and the resolved recipe beside it, then renamed into place in one step.
A directory named `step-N` is therefore always complete; a crash leaves at most a `.tmp-*`
directory, which is ignored and cleaned up by the next save."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

PREFIX = "step-"
STATE_FILE = "trainer_state.json"


def checkpoints(root: str | os.PathLike) -> list[Path]:
    """Complete checkpoints under `root`, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def latest(root: str | os.PathLike) -> Path | None:
    found = checkpoints(root)
    return found[-1] if found else None


def read_state(checkpoint: Path) -> dict:
    return json.loads((checkpoint / STATE_FILE).read_text())


def save(accelerator, root: str | os.PathLike, state: dict, write_extra=None, keep_last: int | None = None) -> Path:
    """Write checkpoint `step-<state['step']>` atomically; `write_extra(dir)` adds files (the
    recipe) before the rename. Every process must call this (save_state is collective)."""
    root = Path(root)
    final = root / f"{PREFIX}{state['step']:08d}"
    tmp = root / f".tmp-{final.name}"
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    if accelerator.is_main_process:
        if write_extra is not None:
            write_extra(tmp)
        _write_synced(tmp / STATE_FILE, json.dumps(state, indent=2))
        if final.exists():  # the same step saved again (a resumed run): replace it
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(root)
        if keep_last:
            for old in checkpoints(root)[:-keep_last]:
                shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
