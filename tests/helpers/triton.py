"""Shared set-up of the Triton kernel tests (test_triton_*.py).

Without a GPU, tests/conftest.py sets TRITON_INTERPRET=1 before anything imports triton, so
kernel modules import normally and run in Triton's CPU interpreter (small shapes, fp32/fp16;
the interpreter computes bf16 dots wrongly, so bf16 and real sizes run on the GPU).
"""
import os

import pytest
import torch

CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
DEV = "cuda" if CUDA else "cpu"


def require_triton():
    """Skip the calling test module unless triton is installed and there is a GPU or the
    interpreter is on; call it at module level before importing kernel modules."""
    triton = pytest.importorskip("triton")
    if not CUDA and not INTERPRET:
        pytest.skip("needs a GPU or TRITON_INTERPRET=1", allow_module_level=True)
    return triton
