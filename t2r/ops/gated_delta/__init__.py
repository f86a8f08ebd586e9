"""Gated delta rule (Gated DeltaNet, Yang, Kautz & Hatamizadeh 2024, arXiv 2412.06464): linear attention whose
state is edited by a delta-rule write (replace the value stored under k_t) and decays by a gate per step."""

import torch

from ..backend import use_triton
from ..utils import map_over_sequences, prefer_recurrent
from .chunk import check_gated_delta_inputs, chunk_gated_delta_rule
from .naive import gated_delta_rule_step, naive_recurrent_gated_delta_rule

__all__ = ["gated_delta_rule", "chunk_gated_delta_rule", "naive_recurrent_gated_delta_rule",
           "gated_delta_rule_step"]


def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated delta rule, Gated DeltaNet eq. 10 with the state S_t in R^{K x V} per kv head:

        S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,     o_t = scale * S_t^T q_t

    Args:
        q: queries ``[B, T, HQ, K]``. HQ may exceed H (GQA): query head i reads kv head ``i // (HQ // H)``;
            HQ must be a multiple of H. k and v are never repeated.
        k: keys ``[B, T, H, K]``. The layer should L2-normalise them: with ||k_t|| = 1 the transition
            I - beta_t k_t k_t^T has eigenvalues 1 and 1 - beta_t, so the state stays bounded.
        v: values ``[B, T, H, V]``.
        g: log decays ``[B, T, H]`` (<= 0, e.g. ``-A * softplus(x)`` as in Mamba-2), one per kv head and step.
        beta: write strengths ``[B, T, H]``, usually ``sigmoid(x)`` in (0, 1). The op accepts beta in (0, 2)
            as well (``2 * sigmoid(x)``: eigenvalues 1 - beta in (-1, 1), the negative-eigenvalue variant of
            Grazzi et al. 2024, arXiv 2411.12537, which helps state tracking); the layer chooses the range.
        scale: multiplies the queries; defaults to ``K ** -0.5``.
        initial_state: ``[B, H, K, V]`` (``[N, H, K, V]`` with cu_seqlens), any float dtype.
        output_final_state: also return the state after the last step.
        cu_seqlens: ``[N + 1]`` integer offsets of N sequences packed along time (requires B == 1), as in
            FlashAttention's varlen API; no information crosses a sequence boundary, states are per sequence.

    Returns:
        ``(o, final_state)``: o ``[B, T, HQ, V]`` in v's dtype; final_state ``[B, H, K, V]``
        (``[N, H, K, V]``) in fp32, or None. All state math is fp32.

    Backends (``t2r.ops.backend``): on CUDA with bf16/fp16 inputs the Triton chunk kernels (K <= 128;
    custom op ``t2r::chunk_gated_delta`` under torch.compile) and, for a few steps without autograd
    (decoding), the Triton recurrent step; elsewhere the chunkwise PyTorch form, or the step loop
    (``gated_delta_rule_step``) when decoding.
    """
    T = check_gated_delta_inputs("gated_delta_rule", q, k, v, g, beta, initial_state, cu_seqlens)[1]
    decoding = prefer_recurrent(T, q, k, v, g, beta, initial_state)
    if use_triton(q, k, v, g, beta, initial_state):
        from . import triton_chunk, triton_recurrent  # lazy: CPU-only installs never import triton
        if decoding:
            return triton_recurrent.fused_recurrent_gated_delta_rule_triton(
                q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens)
        # T == 1 outside decoding (a one-step forward that may be differentiated): the PyTorch form. The chunk
        # kernels' backward faults on the H100 at one step (an illegal address in _bwd_dqk_kernel, T = 1 only,
        # 2026-11-25; open), and one step costs nothing
        if q.shape[-1] <= triton_chunk.MAX_HEAD_DIM_K and T > 1:
            return triton_chunk.chunk_gated_delta_rule_triton(
                q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens)
    if decoding:
        def step(q, k, v, g, beta, initial_state, output_final_state):
            return naive_recurrent_gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state)
        return map_over_sequences(step, (q, k, v, g, beta), initial_state, output_final_state, cu_seqlens)
    return chunk_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                  output_final_state=output_final_state, cu_seqlens=cu_seqlens)
