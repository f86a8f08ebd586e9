"""What t2r writes besides its results: files with the permissions the user's umask gives, a directory replaced
without a moment when it is missing, and a console without other libraries' progress bars for steps that take a
second.

Imports nothing heavy at module level (the command line imports this before torch)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path


def umask() -> int:
    """This process's file-creation mask (read from /proc where it is there, else set and restored)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(path: str | os.PathLike) -> None:
    """Give `path`, or every file under it, the mode a plain `open(..., "w")` would: 0o666 & ~umask.
    safetensors writes through a private temporary file renamed into place, so its files come out 0600
    whatever the umask says."""
    path = Path(path)
    mode = 0o666 & ~umask()
    for file in [path] if path.is_file() else (p for p in path.rglob("*") if p.is_file() and not p.is_symlink()):
        if file.stat().st_mode & 0o777 != mode:
            os.chmod(file, mode)


def real_path(path: str | os.PathLike) -> Path:
    """`path`, or where it leads when it is a symbolic link: the directory a link names is the one t2r replaces."""
    path = Path(path)
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def replace_dir(new: str | os.PathLike, target: str | os.PathLike) -> None:
    """Put directory `new` in place of `target` (which may be absent) and delete the old `target`. On Linux the two
    are exchanged in one step (renameat2 RENAME_EXCHANGE), so `target` is never missing, even if the process dies
    half-way; elsewhere the old one is renamed aside first, leaving a moment without it."""
    import shutil

    new, target = Path(new), real_path(target)  # a link keeps pointing at the replaced directory
    if not target.exists():
        os.replace(new, target)
        return
    if _exchange(new, target):
        shutil.rmtree(new)  # now the old copy
        return
    aside = target.with_name(f".old-{target.name}")
    shutil.rmtree(aside, ignore_errors=True)
    os.replace(target, aside)
    os.replace(new, target)
    shutil.rmtree(aside)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2); False where that is not available."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: a filesystem or kernel without it
        return False
    raise OSError(err, os.strerror(err), str(b))


@contextmanager
def quiet_libraries():
    """transformers' progress bars ("Loading weights", "Writing model shards": a second each, on every load
    and save) off, and restored after. The bars of steps that are long and happen once (huggingface_hub's
    downloads, `datasets` preparing a data file) stay on a terminal, and are off elsewhere (a log file,
    `nohup`), where a bar is one ever-growing line."""
    import importlib.util
    import sys

    from huggingface_hub import utils as hub_utils
    from transformers.utils import logging as hf_logging

    terminal = sys.stderr.isatty()
    was_enabled, hub_was_disabled = hf_logging.is_progress_bar_enabled(), hub_utils.are_progress_bars_disabled()
    hf_logging.disable_progress_bar()  # also turns huggingface_hub's off
    if not hub_was_disabled and terminal:
        hub_utils.enable_progress_bars()
    datasets = None
    if not terminal and importlib.util.find_spec("datasets") is not None:
        import datasets

        datasets_was_disabled = datasets.are_progress_bars_disabled()
        datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
        (hub_utils.disable_progress_bars if hub_was_disabled else hub_utils.enable_progress_bars)()
        if datasets is not None and not datasets_was_disabled:
            datasets.enable_progress_bars()
