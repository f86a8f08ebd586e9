"""Triton chunkwise kernels for GLA: the shared linear-attention kernels (`t2r/ops/common/triton_chunk.py`,
``SCALAR=False``) with one log decay per key channel, anchored inside each chunk (see there)."""

import torch

from ..common.triton_chunk import chunk_linear_attn_triton

__all__ = ["chunk_gla_triton"]


def chunk_gla_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """GLA with Triton chunkwise kernels (forward and backward).

    q [B,T,HQ,K], k/g [B,T,H,K] (g = log decay <= 0), v [B,T,H,V], initial_state [N,H,K,V];
    returns (o [B,T,HQ,V] in v's dtype, final state [N,H,K,V] fp32 or None).
    Same semantics as ``t2r.ops.gla.naive.naive_recurrent_gla``.
    """
    return chunk_linear_attn_triton(q, k, v, g, scale, initial_state, output_final_state,
                                    cu_seqlens, scalar=False)
