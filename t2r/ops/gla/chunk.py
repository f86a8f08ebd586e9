"""Chunkwise GLA: the shared engine (`t2r.ops.common.chunk`) with a per-key-channel decay gk."""

import torch

from ..common.chunk import chunk_gated_linear_attention
from ..utils import (
    check_cu_seqlens,
    check_gate,
    check_qkv,
    check_state,
    default_scale,
    map_over_sequences,
    recompute_in_backward,
)

__all__ = ["chunk_gla", "check_gla_inputs"]


def chunk_gla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunkwise GLA with per-key-channel decay g [B,T,H,K]; same contract as `t2r.ops.gla`."""
    K = check_gla_inputs("chunk_gla", q, k, v, g, initial_state, cu_seqlens)[4]

    def run(q, k, v, g, initial_state, output_final_state, segments=None):
        return recompute_in_backward(
            chunk_gated_linear_attention, q, k, v, gk=g, scale=default_scale(scale, K), initial_state=initial_state,
            output_final_state=output_final_state, chunk_size=chunk_size, segments=segments)

    o, final = map_over_sequences(run, (q, k, v, g), initial_state, output_final_state, cu_seqlens, segmented=True)
    return o.to(v.dtype), final


def check_gla_inputs(op: str, q, k, v, g, initial_state, cu_seqlens) -> tuple[int, ...]:
    """Validate gla arguments; return (B, T, HQ, H, K, V)."""
    B, T, HQ, H, K, V = check_qkv(op, q, k, v)
    check_gate(op, "g", g, [B, T, H, K], "one log decay per key channel of each kv head",
               "for one decay per head use simple_gla")
    n_seqs = check_cu_seqlens(op, cu_seqlens, B, T)
    check_state(op, "initial_state", initial_state, [n_seqs, H, K, V])
    return B, T, HQ, H, K, V
