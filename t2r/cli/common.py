"""Helpers the commands share."""

from __future__ import annotations


def default_device(requested: str | None) -> str:
    import torch

    return requested or ("cuda" if torch.cuda.is_available() else "cpu")


def dtype_arg(name: str) -> str | None:
    return None if name == "auto" else name
