"""`manifest.json`: the size and SHA-256 of every file of a directory t2r wrote, and the check against it.

Every directory t2r writes carries one, written last (after every file is flushed to disk): a training
checkpoint, the trained model `final/`, a `t2r convert` output and the dense SmolLM2 copy in the cache.
`problem` compares a directory with its manifest and says what is wrong (a missing, truncated, changed or
added file); `verify_model_dir` is what loading a model directory calls: a directory without a manifest
(a hub checkpoint, a model saved by other tools) loads unchecked, one with a manifest must match it. The
converted model classes' `from_pretrained` checks a local directory too (`t2r.models.loading`), but not twice:
`verify_model_dir` remembers the directory it passed (every file's inode, size and times) for one later
`already_verified`, which `from_pretrained` asks first. `verify_ahead` starts the same check in a thread, for
the command line to hide it behind its imports; the `verify_model_dir` that follows takes its outcome where no
file changed since it started.
Hashing reads every byte once, several files at a time (hashlib releases the GIL): the 517 MiB dense SmolLM2
copy verifies in 0.73 s on a busy 2-core CPU machine (loading it takes 0.6-1.2 s), about 0.7 GB/s a file.

Imports nothing heavy (the command line may call it before torch loads).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

MANIFEST = "manifest.json"
FORMAT = 1
LOADED_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".json", ".model", ".txt", ".tiktoken",
                   ".jinja", ".py")
"""Files a model load may read: added to a verified model directory, they are refused (other files, a README or
notes, are left alone)."""
T2R_RECORDS = ("t2r_conversion.json", "recipe.yaml", "t2r_adapter.json")
"""Files only t2r writes into a model directory (the conversion record of `t2r convert`, a run's recipe in
`final/` and exports, the record of `t2r.save_adapter`): a directory holding one was written by t2r, with a
manifest."""
REWRITE = "re-export it (or `t2r convert --overwrite` for a conversion) or restore it from a copy"
"""What to do about a damaged model directory t2r wrote."""


class DamagedModelError(ValueError):
    """A model directory whose files no longer match the manifest t2r wrote with them."""


def write(directory: str | os.PathLike) -> dict:
    """Write `directory/manifest.json` for every file under it (each flushed to disk first); returns the entries."""
    directory = Path(directory)
    files = inventory(directory, sync=True)
    _write_synced(directory / MANIFEST, json.dumps({"format": FORMAT, "files": files}, indent=1))
    return files


def inventory(directory: Path, sync: bool = False) -> dict:
    """{relative name: {size, sha256}} of every file under `directory` but the manifest."""
    names = sorted(str(p.relative_to(directory)) for p in directory.rglob("*")
                   if p.is_file() and p != directory / MANIFEST)
    digests = sha256s(directory, names, sync=sync)
    return {name: {"size": (directory / name).stat().st_size, "sha256": digests[name]} for name in names}


def read(directory: Path) -> dict | None:
    """The manifest's entries {name: {size, sha256}}; None when there is none; ValueError when unreadable."""
    try:
        text = (directory / MANIFEST).read_text()
    except FileNotFoundError:
        return None
    try:
        return {name: {"size": int(entry["size"]), "sha256": str(entry["sha256"])}
                for name, entry in json.loads(text)["files"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{MANIFEST} is unreadable ({type(err).__name__}: {err})") from None


def problem(directory: Path, listed: dict, required: tuple[str, ...] = (),
            extra_refused: Callable[[str], bool] = lambda name: True) -> str | None:
    """None if every listed file (and every `required` one) is there with its size and SHA-256, and no file the
    manifest does not list is one `extra_refused` names; else what is wrong, naming the file."""
    present = {str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file()} - {MANIFEST}
    missing = sorted((set(listed) | set(required)) - present)
    if missing:
        return f"{missing[0]} is missing"
    extra = sorted(name for name in present - set(listed) if extra_refused(name))
    if extra:
        return f"{extra[0]} is not in {MANIFEST} (added after the directory was written)"
    for name, expected in listed.items():
        size = (directory / name).stat().st_size
        if size != expected["size"]:
            return (f"{name}{_link_note(directory / name)} is {size:,} bytes, {expected['size']:,} when written "
                    "(truncated or replaced)")
    actual = sha256s(directory, sorted(listed))
    for name in sorted(listed):
        if actual[name] != listed[name]["sha256"]:
            return (f"{name}{_link_note(directory / name)} does not match its SHA-256 checksum (changed or "
                    "corrupted after it was written)")
    return None


def _link_note(path: Path) -> str:
    """` (a symbolic link to <the file it reads>)` for a symbolic link (what was hashed is that file), else ``."""
    return f" (a symbolic link to {path.resolve()})" if path.is_symlink() else ""


def t2r_record(directory: Path) -> str | None:
    """The name of the file that says t2r wrote `directory` (`T2R_RECORDS`), or None."""
    return next((name for name in T2R_RECORDS if (Path(directory) / name).is_file()), None)


def loaded_by_models(name: str) -> bool:
    return name.endswith(LOADED_SUFFIXES)


def verify_model_dir(directory: str | os.PathLike, remember: bool = True, fix: str = REWRITE) -> bool:
    """Check a model directory against its manifest before it loads; True when it had one (and matched), False
    when it has none; DamagedModelError naming the file and `fix` (what to do) otherwise. With `remember`, the
    outcome is kept for one `already_verified` of the unchanged directory (the load that follows)."""
    directory = Path(directory)
    ahead = _taken_ahead(directory, fix)
    if isinstance(ahead, Exception):
        raise ahead
    signature, had_manifest = ahead if ahead is not None else (_signature(directory), _check(directory, fix))
    if remember:
        _verified[_key(directory)] = (signature, had_manifest)
    return had_manifest


def _check(directory: Path, fix: str) -> bool:
    """`verify_model_dir`'s check itself: True when the directory has a manifest and matches it, False when it
    has none, DamagedModelError otherwise."""
    try:
        listed = read(directory)
    except ValueError as err:
        raise DamagedModelError(f"{directory}: {err}; {fix}") from None
    if listed is None:
        return False
    # only what loading reads: the model card (README.md), plots and notes are the user's to edit
    found = problem(directory, {name: entry for name, entry in listed.items() if loaded_by_models(name)},
                    extra_refused=loaded_by_models)
    if found:
        raise DamagedModelError(f"{directory} is damaged: {found}; {fix} (its {MANIFEST} lists what t2r wrote)")
    return True


class _Ahead(threading.Thread):
    """`verify_model_dir`'s check (`_check`) of one directory in a daemon thread; `outcome` is (the files'
    signature when it started, had a manifest), or the error it raised."""

    def __init__(self, directory: Path, fix: str):
        super().__init__(name=f"t2r-verify {directory.name}", daemon=True)
        self.directory, self.fix, self.signature = directory, fix, _signature(directory)
        self.outcome: tuple[tuple, bool] | Exception | None = None

    def run(self) -> None:
        try:
            self.outcome = (self.signature, _check(self.directory, self.fix))
        except Exception as err:  # noqa: BLE001 - kept for the caller's thread, which raises it
            self.outcome = err


_ahead: dict[str, _Ahead] = {}
"""Checks started by `verify_ahead`: {real path: its thread}."""


def verify_ahead(directory: str | os.PathLike, fix: str = REWRITE) -> None:
    """Starts `verify_model_dir(directory)` in a thread (hashing releases the GIL: the caller's imports go on);
    the next `verify_model_dir` of the directory, with the same `fix`, waits for it and takes its outcome if no
    file changed since. A directory that is not there, or is already being checked, starts nothing."""
    directory = Path(directory)
    if directory.is_dir() and _key(directory) not in _ahead:
        _ahead[_key(directory)] = thread = _Ahead(directory, fix)
        thread.start()


def _taken_ahead(directory: Path, fix: str) -> tuple[tuple, bool] | Exception | None:
    """The outcome of `verify_ahead`'s check of `directory` (waited for), once; None when there was none, it was
    for another `fix`, or a file changed since it started (the caller then checks again)."""
    thread = _ahead.pop(_key(directory), None)
    if thread is None:
        return None
    thread.join()
    if thread.fix != fix or _signature(directory) != thread.signature:
        return None
    return thread.outcome


_verified: dict[str, tuple[tuple, bool]] = {}
"""Directories `verify_model_dir` passed: {real path: (signature of its files, had a manifest)}."""


def already_verified(directory: str | os.PathLike) -> bool | None:
    """What `verify_model_dir` returned for `directory` if it checked it and no file changed since (the same
    inode, size, modification and change time of each; any write changes the change time), else None. Answers
    once: a later load checks again."""
    directory = Path(directory)
    earlier = _verified.pop(_key(directory), None)
    if earlier is None or earlier[0] != _signature(directory):
        return None
    return earlier[1]


def _key(directory: Path) -> str:
    return str(directory.resolve())


def _signature(directory: Path) -> tuple:
    """Every entry under `directory` with what any change to it changes (symbolic links followed)."""
    entries = []
    for path in sorted(directory.rglob("*")):
        try:
            st = path.stat()
        except OSError:  # a dangling link
            entries.append((str(path), None))
            continue
        if stat.S_ISREG(st.st_mode):
            entries.append((str(path), path.is_symlink(), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
                            st.st_ctime_ns))
    return tuple(entries)


def sha256s(directory: Path, names: list[str], sync: bool = False) -> dict[str, str]:
    """{name: hex SHA-256} of files under `directory`, up to 8 at a time."""
    with ThreadPoolExecutor(max_workers=min(8, max(1, len(names)))) as pool:  # hashlib releases the GIL
        return dict(zip(names, pool.map(lambda name: sha256(directory / name, sync), names)))


def sha256(path: Path, sync: bool = False) -> str:
    """Hex SHA-256 of a file; with `sync`, its data is also flushed to disk (before a rename publishes it)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 23):
            digest.update(chunk)
        if sync:
            os.fsync(fh.fileno())
    return digest.hexdigest()


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
