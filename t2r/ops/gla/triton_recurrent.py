"""Triton recurrent step for GLA (decoding): the shared kernel of `t2r/ops/common/triton_recurrent.py`
with one log decay per key channel."""

import torch

from ..common.triton_recurrent import fused_recurrent_linear_attn_triton

__all__ = ["fused_recurrent_gla_triton"]


def fused_recurrent_gla_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
    scale: float | None = None, initial_state: torch.Tensor | None = None,
    output_final_state: bool = False, cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """GLA recurrence step by step (decoding). g [B,T,H,K]; forward only, no autograd.

    Same semantics as ``t2r.ops.gla.naive.naive_recurrent_gla`` (plus cu_seqlens).
    """
    return fused_recurrent_linear_attn_triton(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens,
                                              False)
