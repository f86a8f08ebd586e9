"""Triton recurrent step for simple GLA (decoding): the shared kernel of
`t2r/ops/common/triton_recurrent.py` with one log decay per head and step."""

import torch

from ..common.triton_recurrent import fused_recurrent_linear_attn_triton

__all__ = ["fused_recurrent_simple_gla_triton"]


def fused_recurrent_simple_gla_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
    scale: float | None = None, initial_state: torch.Tensor | None = None,
    output_final_state: bool = False, cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Simple-GLA recurrence step by step (decoding). g [B,T,H]; forward only, no autograd.

    Same semantics as ``t2r.ops.simple_gla.naive.naive_recurrent_simple_gla`` (plus cu_seqlens).
    """
    return fused_recurrent_linear_attn_triton(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens,
                                              True)
