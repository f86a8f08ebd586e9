"""Test session set-up: without a GPU, Triton kernels run in Triton's CPU interpreter.

Triton reads TRITON_INTERPRET when it is first imported, so this must happen before any test module
imports it (kernel tests then run at small shapes on fp32/fp16; bf16 is checked on the GPU).
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
