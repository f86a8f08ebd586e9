"""Triton chunkwise kernels for simple GLA / retention (one scalar log decay per head and step).

The kernels are shared with GLA (``t2r/ops/common/triton_chunk.py``, ``SCALAR=True``): with a
scalar decay the intra-chunk decay is the exact BT x BT matrix 2^(b_i - b_j), no anchoring.
"""

import torch

from ..common.triton_chunk import chunk_linear_attn_triton

__all__ = ["chunk_simple_gla_triton"]

# True: the scalar-gate kernels where they were gradient-checked on the H100 (K >= 32 and
# V >= 64: the Mistral and SmolLM2 head dims among them); elsewhere, and always when False,
# run through the per-channel (GLA) kernels with g broadcast over K (slower; autograd sums the
# broadcast gate gradient back over K). On the H100 with Triton 3.6 the scalar dq/dk kernel
# gave wrong dq/dk at (K, V) = (16, 16) fp32 and an illegal memory access at (64, 32) bf16
# with one kv head; the cause is not found yet, so those sizes take the GLA path.
SCALAR_KERNEL = True


def _scalar_kernel_ok(q: torch.Tensor, v: torch.Tensor) -> bool:
    return SCALAR_KERNEL and q.shape[-1] >= 32 and v.shape[-1] >= 64


def chunk_simple_gla_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Simple GLA with Triton chunkwise kernels (forward and backward).

    q [B,T,HQ,K], k [B,T,H,K], v [B,T,H,V], g [B,T,H] (log decay <= 0),
    initial_state [N,H,K,V]; returns (o [B,T,HQ,V] in v's dtype, final state fp32 or None).
    Same semantics as ``t2r.ops.simple_gla.naive.naive_recurrent_simple_gla``. K <= 128.
    """
    if not _scalar_kernel_ok(q, v):
        gv = g.unsqueeze(-1).expand(*g.shape, q.shape[-1])
        return chunk_linear_attn_triton(q, k, v, gv, scale, initial_state, output_final_state,
                                        cu_seqlens, scalar=False)
    return chunk_linear_attn_triton(q, k, v, g, scale, initial_state, output_final_state,
                                    cu_seqlens, scalar=True)
