"""The floating-point types t2r loads, trains and evaluates in: one table for the command line, recipes,
training and evaluation. Imports torch only when a name is turned into a dtype (the command line reads the
names before it imports torch)."""

from __future__ import annotations

DTYPE_NAMES = ("float32", "bfloat16", "float16")


def torch_dtype(name: str):
    """The torch dtype called `name` (one of DTYPE_NAMES); ValueError naming the choices otherwise."""
    if name not in DTYPE_NAMES:
        raise ValueError(f"dtype {name!r} is not one of {', '.join(DTYPE_NAMES)}")
    import torch

    return getattr(torch, name)
