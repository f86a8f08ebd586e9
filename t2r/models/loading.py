"""`from_pretrained` of the converted classes checks a local directory that t2r wrote, as t2r's own loaders do
(`t2r.sources.load_source`), so that `AutoModelForCausalLM.from_pretrained(dir)` refuses damage in one line:
a file that does not match `manifest.json` (a symbolic link named with the file it leads to), a directory whose
conversion record or recipe says t2r wrote it but whose manifest is gone, and weights holding nan or inf.
A hub id, a directory t2r did not write (no manifest, no t2r record) and weights passed in memory load as
before. Where t2r's loader verified the directory just before, its files are not hashed again
(`manifest.already_verified`). For the 516 MiB SmolLM2-135M conversion on a busy 2-core CPU machine: hashing
1.9 s, the finite check 0.18 s, the load itself 0.2 s.
"""

from __future__ import annotations

import os
from pathlib import Path

from t2r import manifest
from t2r.manifest import DamagedModelError


def local_dir(path, kwargs: dict) -> Path | None:
    """The local model directory `from_pretrained(path, **kwargs)` reads, or None (a hub id, weights given in
    memory, a GGUF file)."""
    if path is None or kwargs.get("state_dict") is not None or kwargs.get("gguf_file"):
        return None
    try:
        directory = Path(os.fspath(path)) / (kwargs.get("subfolder") or "")
    except TypeError:
        return None
    return directory if directory.is_dir() else None


def verify_before_loading(directory: Path) -> bool:
    """Check `directory` against its manifest (unless t2r's loader just did); True when t2r wrote it (its
    weights are then checked finite after loading). DamagedModelError in one line otherwise."""
    checked = manifest.already_verified(directory)  # t2r's loader just verified it: no second hashing
    if checked if checked is not None else manifest.verify_model_dir(directory, remember=False):
        return True
    record = manifest.t2r_record(directory)
    if record is not None:
        raise DamagedModelError(f"{directory}: {manifest.MANIFEST} is missing, yet {record} says t2r wrote this "
                                f"directory, so its files cannot be checked; {manifest.REWRITE}")
    return False


def from_pretrained_verified(load, path, args, kwargs):
    """`load(path, *args, **kwargs)` (the source class's `from_pretrained`), checking a local directory first
    and the loaded weights after."""
    directory = local_dir(path, kwargs)
    written_by_t2r = directory is not None and verify_before_loading(directory)
    loaded = load(path, *args, **kwargs)
    if written_by_t2r:
        from t2r.model_check import require_finite

        require_finite(loaded[0] if isinstance(loaded, tuple) else loaded, str(directory), manifest.REWRITE)
    return loaded
