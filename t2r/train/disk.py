"""A full disk while a checkpoint or the final model is written: one line naming the directory and the fix, the
half-written copy deleted (it is hidden and never used, and frees the space it took), the previous checkpoint
untouched. torch reports a short write as `RuntimeError: [enforce fail at inline_container.cc] . unexpected pos
...`, safetensors as its own error with "No space left on device" inside: both count, as do ENOSPC and EDQUOT."""

from __future__ import annotations

import errno
import shutil
from contextlib import contextmanager
from pathlib import Path

from .errors import RunError

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_FULL_WORDS = ("No space left on device", "unexpected pos", "Disk quota exceeded", "StorageFull",
               "PytorchStreamWriter failed writing")


class DiskFullError(RunError):
    """No space was left to write a checkpoint or the final model."""


def is_disk_full(err: BaseException) -> bool:
    if isinstance(err, OSError) and err.errno in _FULL_ERRNOS:
        return True
    return any(word in str(err) for word in _FULL_WORDS)


@contextmanager
def disk_full_stops(partial: Path, what: str, kept: str):
    """Within the block, a full disk deletes `partial` (the hidden directory being written) and raises
    DiskFullError saying that `what` could not be written and what is `kept`."""
    try:
        yield
    except Exception as err:  # noqa: BLE001 - torch, safetensors and the OS each report it their own way
        if not is_disk_full(err):
            raise
        shutil.rmtree(partial, ignore_errors=True)
        detail = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
        raise DiskFullError(f"no space left on the disk of {partial.parent} while writing {what} ({detail}); {kept}: "
                            "free space there (or set checkpoint.dir to a larger disk), then --resume") from None
