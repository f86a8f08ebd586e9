"""t2r's version, without importing the rest of t2r (torch, transformers)."""

from __future__ import annotations

__version__ = "0.1.0"


def version() -> str:
    """The installed distribution's version (pip's metadata), else `__version__` (a source checkout)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("t2r")
    except PackageNotFoundError:
        return __version__
