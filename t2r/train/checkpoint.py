"""Training checkpoints that are never half-written, checked before they are trusted, and loaded without
running code from disk.

A checkpoint `step-N` is built in a hidden `.tmp-step-N` directory: accelerate's `save_state` (model as
safetensors, optimizer and AMP scaler as tensors), each process's RNG states as JSON + safetensors (not
accelerate's pickle), the trainer state (step, tokens, recipe changes) as JSON and the resolved recipe; last,
`manifest.json` records the size and SHA-256 of every file. Then the directory is renamed into place in
one step, so `step-N` is complete or absent; a crash leaves at most a `.tmp-*` directory, which the
next save removes. Files get the mode the user's umask gives (safetensors alone would write 0600).

`verify` re-reads every file against the manifest and refuses files that only pickle can restore;
`resumable` returns the newest checkpoint that passes and moves damaged ones to `damaged/`, saying what
was wrong. `load` restores it inside `no_code_from_disk()`.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from t2r import manifest
from t2r.outputs import follow_umask

from . import rng
from .disk import disk_full_stops
from .errors import CheckpointError, RunError
from .safe_load import no_code_from_disk

PREFIX = "step-"
STATE_FILE = "trainer_state.json"
MANIFEST = manifest.MANIFEST
DAMAGED = "damaged"
_STEP = re.compile(rf"{PREFIX}(\d+)(?:-[A-Za-z0-9_-]+)?")  # step-N, or step-N-<stage> in a staged run
_PICKLED = re.compile(r"\.(pkl|pickle)$|^custom_checkpoint_\d+")  # need an unrestricted unpickler


def step_of(checkpoint: Path) -> int:
    return int(_STEP.fullmatch(checkpoint.name).group(1))


def checkpoints(root: str | os.PathLike) -> list[Path]:
    """Checkpoint directories under `root` (renamed into place, so complete unless damaged later), oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir() and _STEP.fullmatch(p.name)), key=step_of)


def latest(root: str | os.PathLike) -> Path | None:
    found = checkpoints(root)
    return found[-1] if found else None


def read_state(checkpoint: Path) -> dict:
    return json.loads((checkpoint / STATE_FILE).read_text())


def save(accelerator, root: str | os.PathLike, state: dict, write_extra: Callable[[Path], None] | None = None,
         keep_last: int | None = None, label: str | None = None) -> Path:
    """Write checkpoint `step-<state['step']>` (`step-<step>-<label>` with a label: a stage's name)
    atomically; `write_extra(dir)` adds files (the recipe) before the manifest. Every process must call this
    (save_state is collective). Pruning keeps the `keep_last` newest checkpoints up to this one, never this one
    and never a newer one."""
    root = Path(root)
    final = root / (f"{PREFIX}{state['step']:08d}" + (f"-{label}" if label else ""))
    tmp = root / f".tmp-{final.name}"
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
    accelerator.wait_for_everyone()
    previous = latest(root)
    kept = f"the newest checkpoint, {previous.name}, is intact" if previous else "no checkpoint was written yet"
    with disk_full_stops(tmp, f"checkpoint {final.name}", kept):
        rank, failed = accelerator.process_index, None
        try:
            with _tied_weights_note_silenced(accelerator):
                accelerator.save_state(str(tmp))
            (tmp / f"random_states_{rank}.pkl").unlink(missing_ok=True)  # replaced by rng-<rank>.json/.safetensors
            rng.save(tmp, rank)
        except Exception as err:  # noqa: BLE001 - raised below, once every process knows
            failed = err
        _agree_on_the_write(accelerator, failed, tmp, f"checkpoint {final.name}", kept)
        if accelerator.is_main_process:
            if write_extra is not None:
                write_extra(tmp)
            follow_umask(tmp)
            _write_synced(tmp / STATE_FILE, json.dumps(state, indent=2))
            manifest.write(tmp)
    if accelerator.is_main_process:
        if final.exists():  # the same step saved again (a resumed run): replace it
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(root)
        if keep_last:
            prune(root, keep_last, final)
    accelerator.wait_for_everyone()
    return final


def _agree_on_the_write(accelerator, failed: Exception | None, tmp: Path, what: str, kept: str) -> None:
    """After each process wrote its part of `tmp`: `failed` (this process's error) raised here, and on the others
    a one-line RunError naming the first process that failed, so that no process goes on to wait for one
    that stopped (on NCCL it would wait until the launcher's grace ran out) and each says why it ends."""
    if accelerator.num_processes == 1:
        if failed is not None:
            raise failed
        return
    import torch
    import torch.distributed as dist

    world = accelerator.num_processes
    first = torch.tensor([accelerator.process_index if failed is not None else world], device=accelerator.device)
    dist.all_reduce(first, op=dist.ReduceOp.MIN)
    if failed is not None:
        raise failed
    if first.item() < world:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RunError(f"process {first.item()} could not write its part of {what} (its own line says why); "
                       f"{kept}; the half-written copy is removed")


def prune(root: Path, keep_last: int, current: Path) -> None:
    """Delete checkpoints older than `current` beyond the newest `keep_last` (counting `current`)."""
    older = [c for c in checkpoints(root) if step_of(c) < step_of(current)]
    for old in older[:max(0, len(older) - (keep_last - 1))]:
        shutil.rmtree(old, ignore_errors=True)


def remove_after_final(root: Path, final: Path) -> list[Path]:
    """`checkpoint.keep_last: 0`: once `final` (the trained model, renamed into place) is on disk, delete
    every checkpoint; the files of `final` and the directories are flushed first, so a crash at any point
    leaves the final model or the newest checkpoint. Returns what was deleted."""
    for path in sorted(p for p in final.rglob("*") if p.is_file()):
        with open(path, "rb") as fh:
            os.fsync(fh.fileno())
    _fsync_dir(final)
    _fsync_dir(root)
    removed = checkpoints(root)
    for old in removed:
        shutil.rmtree(old, ignore_errors=True)
    return removed


def verify(checkpoint: Path) -> str | None:
    """None if every file matches the manifest and none needs unpickling, else what is wrong."""
    for path in sorted(p for p in checkpoint.rglob("*") if p.is_file()):
        if _PICKLED.search(path.name):
            return (f"{path.relative_to(checkpoint)} can only be restored by unpickling, which could run code "
                    "stored in it; t2r never writes such a file")
    try:
        listed = manifest.read(checkpoint)
    except ValueError as err:
        return str(err)
    if listed is None:
        return f"{MANIFEST} is missing (written by t2r before checksums, or deleted)"
    return manifest.problem(checkpoint, listed, required=(STATE_FILE, "recipe.yaml"))


def resumable(root: Path, log: Callable[[str], None] = print) -> Path | None:
    """The newest checkpoint that passes `verify`; each damaged newer one is moved to `root/damaged/`.
    None when there is no checkpoint; CheckpointError when there are some and none is intact."""
    found = checkpoints(root)
    damaged = []
    for checkpoint in reversed(found):
        problem = verify(checkpoint)
        if problem is None:
            return checkpoint
        aside = root / DAMAGED / checkpoint.name
        if aside.exists():
            shutil.rmtree(aside)
        aside.parent.mkdir(exist_ok=True)
        os.replace(checkpoint, aside)
        damaged.append(checkpoint.name)
        log(f"checkpoint {checkpoint.name} is damaged: {problem}; moved it to {aside}")
    if damaged:
        raise CheckpointError(f"no intact checkpoint in {root} to resume from ({', '.join(damaged)} damaged, moved to "
                              f"{root / DAMAGED}); start afresh with --overwrite")
    return None


def load(accelerator, checkpoint: Path) -> dict:
    """Restore model, optimizer, scaler and this process's RNG from a verified checkpoint; its trainer state."""
    try:
        with no_code_from_disk():
            accelerator.load_state(str(checkpoint))
        saved_processes = len(list(checkpoint.glob("rng-*.json")))
        if saved_processes == accelerator.num_processes:
            rng.restore(checkpoint, accelerator.process_index)
        else:  # another process count: the stream position and global batch carry over (see batches.MicroBatches)
            state = read_state(checkpoint)
            rng.reseed(1_000_003 * state["step"] + accelerator.process_index)
            if accelerator.is_main_process:
                print(f"resuming on {accelerator.num_processes} processes a run saved by {saved_processes}: the data "
                      "position and the global batch are the same; each process's random numbers are reseeded "
                      "(dropout, if any, draws differently from an uninterrupted run)")
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as err:  # verified files that still cannot be loaded: another model, or unsafe content
        # (torch.distributed.checkpoint's CheckpointException derives from BaseException)
        raise CheckpointError(f"cannot resume from {checkpoint}: {type(err).__name__}: {err}") from err
    return read_state(checkpoint)


class _TiedWeightsNote(logging.Filter):
    """Drops accelerate's "Removed shared tensor {...} while saving. This should be OK, but check ..." when
    every name it lists is a tied weight the model declares (`lm_head.weight` of tied embeddings): safetensors
    stores a shared tensor once, and loading the model re-ties it."""

    def __init__(self, tied: set[str]):
        super().__init__()
        self.tied = tied

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "Removed shared tensor" not in message:
            return True
        try:
            names = ast.literal_eval(message[message.index("{"):message.index("}") + 1])
        except (ValueError, SyntaxError):
            return True
        return not all(any(name == t or name.endswith("." + t) for t in self.tied) for name in names)


@contextmanager
def _tied_weights_note_silenced(accelerator):
    tied = set()
    for model in accelerator._models:
        model = accelerator.unwrap_model(model)
        model = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft
        tied.update(getattr(model, "all_tied_weights_keys", None) or {})
    logger = logging.getLogger("accelerate.utils.other")
    note = _TiedWeightsNote(tied)
    logger.addFilter(note)
    try:
        yield
    finally:
        logger.removeFilter(note)


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
