"""Pieces shared by several ops (as fla keeps them in fla/ops/common/); each op folder holds only its own.

* ``chunk.py``: the chunkwise PyTorch engine of gated linear attention (``chunk_gated_linear_attention``),
  run by gla (per-key-channel gate), simple_gla (scalar gate) and both passes of gsa (value-side gate).
* ``triton_chunk.py`` with ``triton_scan.py``, ``triton_intra.py``, ``triton_decay.py``: the chunkwise
  Triton kernels of gla and simple_gla (``chunk_linear_attn_triton``; the custom op ``t2r::chunk_linear_attn``).
* ``triton_recurrent.py``: their recurrent decode kernel (``fused_recurrent_linear_attn_triton``).

Nothing is imported here: the Triton modules load only when a kernel runs (CPU-only installs never import triton).
"""
