"""Gated Slot Attention (GSA, Zhang et al., 2024): bounded-memory attention with a softmax over slots."""

import torch

from ..backend import use_triton
from ..utils import map_over_sequences, prefer_recurrent
from .chunk import check_gsa_inputs, chunk_gsa
from .naive import naive_recurrent_gsa

__all__ = ["gsa", "chunk_gsa", "naive_recurrent_gsa"]


def gsa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    s: torch.Tensor,
    g: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: tuple[torch.Tensor, torch.Tensor] | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """Gated slot attention, GSA paper eq. 6-7 (two-pass form):

        K~_t = Diag(exp g_t) K~_{t-1} + s_t k_t^T
        o'_t = softmax(scale * K~_t q_t)            (over the M slots)
        V~_t = Diag(exp g_t) V~_{t-1} + s_t v_t^T
        o_t  = V~_t^T o'_t

    Args:
        q: queries ``[B, T, HQ, K]``; HQ a multiple of H, query head i reads kv
            head ``i // (HQ // H)`` (GQA).
        k: keys ``[B, T, H, K]``.
        v: values ``[B, T, H, V]``.
        s: slot write weights ``[B, T, H, M]`` (M slots; typically ``1 - exp(g)``).
        g: log forget gates of the slots ``[B, T, H, M]`` (<= 0).
        scale: multiplies the queries before the slot softmax; defaults to ``K ** -0.5``.
        initial_state: pair ``(K~ [B, H, K, M], V~ [B, H, M, V])`` (``N`` instead of
            ``B`` with cu_seqlens). K~ is stored transposed (key dim first).
        output_final_state: also return the slot memories after the last step.
        cu_seqlens: ``[N + 1]`` integer offsets of N sequences packed along time
            (requires B == 1); sequences do not see each other, states are per sequence.

    Returns:
        ``(o, final_state)``: o ``[B, T, HQ, V]`` in v's dtype; final_state the pair
        ``(K~, V~)`` in fp32, or None. All state math is fp32.
    """
    T = check_gsa_inputs("gsa", q, k, v, s, g, initial_state, cu_seqlens)[1]
    if initial_state is not None:
        initial_state = tuple(initial_state)
    # Backend dispatch: Triton kernels on CUDA tensors (see t2r.ops.backend.use_triton).
    # The chunk kernels were checked on the H100 with K, V in {64, 128} and 64 slots; smaller
    # head/slot dims stay on the PyTorch path (see the note in triton_chunk._tile).
    if use_triton(q, k, v, s, g):
        if prefer_recurrent(T, q, k, v, s, g, initial_state):
            from .triton_recurrent import fused_recurrent_gsa_triton
            return fused_recurrent_gsa_triton(q, k, v, s, g, scale=scale, initial_state=initial_state,
                                              output_final_state=output_final_state, cu_seqlens=cu_seqlens)
    if use_triton(q, k, v, s, g) and min(q.shape[-1], v.shape[-1], s.shape[-1]) >= 64:
        from .triton_chunk import chunk_gsa_triton
        return chunk_gsa_triton(q, k, v, s, g, scale=scale, initial_state=initial_state,
                                output_final_state=output_final_state, cu_seqlens=cu_seqlens)
    if prefer_recurrent(T, q, k, v, s, g, initial_state):
        def step(q, k, v, s, g, initial_state, output_final_state):
            return naive_recurrent_gsa(q, k, v, s, g, scale, initial_state, output_final_state)
        return map_over_sequences(step, (q, k, v, s, g), initial_state, output_final_state, cu_seqlens)
    return chunk_gsa(q, k, v, s, g, scale=scale, initial_state=initial_state,
                     output_final_state=output_final_state, cu_seqlens=cu_seqlens)
