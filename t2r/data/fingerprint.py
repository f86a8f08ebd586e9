"""What the training data was: the size and SHA-256 of every local data file, recorded in each checkpoint and
compared when a run resumes, so data edited in place between a stop and `--resume` is refused instead of
silently breaking the exact continuation.

A file up to `FULL_HASH_BYTES` is hashed whole (about 0.7 GB/s a file, several files at once); a larger one by
its size and a sample (its first and last MiB and 256 blocks of 64 KiB spread over it), which an edit that
changes the length, the start, the end or one of the blocks changes. Hub datasets are named by the recipe
(`data.path`, `name`, `split`), which resume already compares; they get no fingerprint.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from t2r.paths import is_local

from .config import DataConfig
from .files import local_files

FULL_HASH_BYTES = 1 << 30
SAMPLE_BLOCKS, BLOCK, EDGE = 256, 1 << 16, 1 << 20


def fingerprint(cfg: DataConfig) -> dict | None:
    """{file: {"size", "sha256" or "sampled_sha256"}} of the local files of `cfg`; None for a hub dataset."""
    path = os.path.expanduser(cfg.path)
    if not is_local(path):
        return None
    _, files = local_files(path)
    with ThreadPoolExecutor(max_workers=min(8, len(files))) as pool:
        return dict(zip(files, pool.map(_file_print, files)))


def changes(stored: dict | None, current: dict | None) -> list[str]:
    """What differs between two fingerprints, one line a file ([] when equal, or when either is missing)."""
    if stored is None or current is None:
        return []
    lines = []
    for name in sorted(set(stored) | set(current)):
        old, new = stored.get(name), current.get(name)
        if old == new:
            continue
        if old is None:
            lines.append(f"{name}: added")
        elif new is None:
            lines.append(f"{name}: missing")
        elif old.get("size") != new.get("size"):
            lines.append(f"{name}: {old['size']:,} bytes then, {new['size']:,} now")
        else:
            lines.append(f"{name}: same size, other content (its checksum differs)")
    return lines


def _file_print(file: str) -> dict:
    size = Path(file).stat().st_size
    digest = hashlib.sha256()
    with open(file, "rb") as fh:
        if size <= FULL_HASH_BYTES:
            while chunk := fh.read(1 << 23):
                digest.update(chunk)
            return {"size": size, "sha256": digest.hexdigest()}
        offsets = [0, size - EDGE] + [i * (size - BLOCK) // (SAMPLE_BLOCKS - 1) for i in range(SAMPLE_BLOCKS)]
        for offset, length in zip(offsets, [EDGE, EDGE] + [BLOCK] * SAMPLE_BLOCKS):
            fh.seek(offset)
            digest.update(fh.read(length))
    return {"size": size, "sampled_sha256": digest.hexdigest()}
