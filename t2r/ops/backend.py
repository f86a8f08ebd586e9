"""Backend choice for the ops: Triton kernels on GPU, the PyTorch forms elsewhere.

The environment variable ``T2R_OPS_BACKEND`` overrides the automatic choice:

* ``triton``: always use the Triton kernels (fails loudly if they cannot run),
* ``torch``: always use the PyTorch chunkwise/recurrent forms,
* ``auto`` or unset: Triton only when the tensors live on CUDA and triton imports.
"""
import functools
import os

import torch

__all__ = ["use_triton", "BACKEND_ENV"]

BACKEND_ENV = "T2R_OPS_BACKEND"
_CHOICES = ("auto", "triton", "torch")


@functools.lru_cache(maxsize=1)
def _triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def use_triton(*tensors: torch.Tensor) -> bool:
    """True when the op should run its Triton kernel on these tensors."""
    choice = os.environ.get(BACKEND_ENV, "auto").strip().lower() or "auto"
    if choice not in _CHOICES:
        raise ValueError(
            f"{BACKEND_ENV}={choice!r} is not a known backend; set it to one of {_CHOICES}"
        )
    if choice != "auto":
        return choice == "triton"
    on_cuda = all(t.is_cuda for t in tensors if isinstance(t, torch.Tensor))
    return bool(tensors) and on_cuda and _triton_importable()
