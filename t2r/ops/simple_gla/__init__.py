"""Simple GLA: linear attention with one data-dependent (or constant, RetNet) decay per head."""

import torch

from ..backend import use_triton
from ..utils import map_over_sequences, prefer_recurrent
from .chunk import check_simple_gla_inputs, chunk_simple_gla
from .naive import naive_recurrent_simple_gla

__all__ = ["simple_gla", "chunk_simple_gla", "naive_recurrent_simple_gla"]


def simple_gla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Linear attention with a scalar decay per head and step:

        S_t = exp(g_t) S_{t-1} + k_t v_t^T,     o_t = scale * S_t^T q_t

    A constant ``g = log(gamma)`` per head is RetNet's retention.

    Args:
        q: queries ``[B, T, HQ, K]``; HQ a multiple of H, query head i reads kv
            head ``i // (HQ // H)`` (GQA).
        k: keys ``[B, T, H, K]``.
        v: values ``[B, T, H, V]``.
        g: log decays ``[B, T, H]`` (<= 0), one per kv head and step.
        scale: multiplies the queries; defaults to ``K ** -0.5``.
        initial_state: ``[B, H, K, V]`` (``[N, H, K, V]`` with cu_seqlens).
        output_final_state: also return the state after the last step.
        cu_seqlens: ``[N + 1]`` integer offsets of N sequences packed along time
            (requires B == 1); sequences do not see each other, states are per sequence.

    Returns:
        ``(o, final_state)``: o ``[B, T, HQ, V]`` in v's dtype; final_state
        ``[B, H, K, V]`` (``[N, H, K, V]``) in fp32, or None. All state math is fp32.
    """
    T = check_simple_gla_inputs("simple_gla", q, k, v, g, initial_state, cu_seqlens)[1]
    # Backend dispatch: Triton kernels plug in here (see t2r.ops.backend.use_triton).
    if use_triton(q, k, v, g, initial_state) and q.shape[-1] <= 128:
        from . import triton_chunk, triton_recurrent  # lazy: CPU-only installs never import triton
        kern = triton_recurrent.fused_recurrent_simple_gla_triton if prefer_recurrent(T, q, k, v, g, initial_state) \
            else triton_chunk.chunk_simple_gla_triton
        return kern(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens)
    if prefer_recurrent(T, q, k, v, g, initial_state):
        def step(q, k, v, g, initial_state, output_final_state):
            return naive_recurrent_simple_gla(q, k, v, g, scale, initial_state, output_final_state)
        return map_over_sequences(step, (q, k, v, g), initial_state, output_final_state, cu_seqlens)
    return chunk_simple_gla(q, k, v, g, scale=scale, initial_state=initial_state,
                            output_final_state=output_final_state, cu_seqlens=cu_seqlens)
