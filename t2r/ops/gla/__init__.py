"""Gated Linear Attention (GLA, Yang et al., 2024): linear attention with a per-key-channel forget gate."""

import torch

from ..backend import use_triton
from ..common.chunk import chunk_gated_linear_attention  # the shared engine, kept importable from here
from ..utils import map_over_sequences, prefer_recurrent
from .chunk import check_gla_inputs, chunk_gla
from .naive import naive_recurrent_gla

__all__ = ["gla", "chunk_gla", "naive_recurrent_gla", "chunk_gated_linear_attention"]


def gla(
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
    """Gated linear attention, GLA paper eq. 3:

        S_t = Diag(exp g_t) S_{t-1} + k_t v_t^T,     o_t = scale * S_t^T q_t

    Args:
        q: queries ``[B, T, HQ, K]``. HQ may exceed H (GQA): query head i reads
            key/value head ``i // (HQ // H)``; HQ must be a multiple of H.
        k: keys ``[B, T, H, K]``.
        v: values ``[B, T, H, V]``.
        g: log forget gates ``[B, T, H, K]`` (<= 0, e.g. ``logsigmoid(x) / 16``),
            one per key channel of each kv head.
        scale: multiplies the queries; defaults to ``K ** -0.5``.
        initial_state: ``[B, H, K, V]`` (``[N, H, K, V]`` with cu_seqlens), any float dtype.
        output_final_state: also return the state after the last step.
        cu_seqlens: ``[N + 1]`` integer offsets of N sequences packed along time
            (requires B == 1), as in FlashAttention's varlen API; no information
            crosses a sequence boundary and states are per sequence.

    Returns:
        ``(o, final_state)``: o ``[B, T, HQ, V]`` in v's dtype; final_state
        ``[B, H, K, V]`` (``[N, H, K, V]``) in fp32, or None. All state math is fp32.
    """
    T = check_gla_inputs("gla", q, k, v, g, initial_state, cu_seqlens)[1]
    # Backend dispatch: Triton kernels plug in here (see t2r.ops.backend.use_triton).
    if use_triton(q, k, v, g, initial_state):
        from . import triton_chunk, triton_recurrent  # lazy: CPU-only installs never import triton
        kern = triton_recurrent.fused_recurrent_gla_triton if prefer_recurrent(T, q, k, v, g, initial_state) \
            else triton_chunk.chunk_gla_triton
        return kern(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens)
    if prefer_recurrent(T, q, k, v, g, initial_state):
        def step(q, k, v, g, initial_state, output_final_state):
            return naive_recurrent_gla(q, k, v, g, scale, initial_state, output_final_state)
        return map_over_sequences(step, (q, k, v, g), initial_state, output_final_state, cu_seqlens)
    return chunk_gla(q, k, v, g, scale=scale, initial_state=initial_state,
                     output_final_state=output_final_state, cu_seqlens=cu_seqlens)
