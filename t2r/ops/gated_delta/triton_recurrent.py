"""Triton recurrent step of the gated delta rule for decoding (few steps, no autograd).

One program per (V-block, sequence x kv head) keeps the fp32 state tile S [K, BV] in registers and walks
the T steps (Gated DeltaNet eq. 10 with the K x V state):

    S <- exp(g_t) S,   u = beta_t (v_t - S^T k_t),   S <- S + k_t u^T,   o_t = scale * S^T q_t

for every query head of its GQA group, so one step reads and writes the state once, whatever the group
size. S^T k_t only sums over K, so V-blocks are independent. Forward only: training uses the chunk kernels.
"""

import torch
import triton
import triton.language as tl

from ..triton_utils import next_pow2

__all__ = ["fused_recurrent_gated_delta_rule_triton"]


@triton.jit(do_not_specialize=["T"])
def _recurrent_fwd_kernel(
    q, k, v, g, beta, o, h0, ht, cu_seqlens, scale, T,
    HQ: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_H0: tl.constexpr, STORE_HT: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // H, i_nh % H
    G: tl.constexpr = HQ // H
    if IS_VARLEN:
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
        T = (eos - bos).to(tl.int32)
    else:
        bos = (i_n * T).to(tl.int64)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_h = m_k[:, None] & m_v[None, :]
    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        b_h += tl.load(h0 + i_nh * K * V + o_k[:, None] * V + o_v[None, :], mask=m_h, other=0.).to(tl.float32)
    for t in range(T):
        tok = bos + t
        b_k = tl.load(k + (tok * H + i_h) * K + o_k, mask=m_k, other=0.).to(tl.float32)
        b_v = tl.load(v + (tok * H + i_h) * V + o_v, mask=m_v, other=0.).to(tl.float32)
        b_g = tl.load(g + tok * H + i_h).to(tl.float32)
        b_beta = tl.load(beta + tok * H + i_h).to(tl.float32)
        b_h = b_h * tl.exp(b_g)
        b_u = b_beta * (b_v - tl.sum(b_h * b_k[:, None], axis=0))
        b_h += b_k[:, None] * b_u[None, :]
        for i_g in tl.static_range(G):
            i_hq = i_h * G + i_g
            b_q = tl.load(q + (tok * HQ + i_hq) * K + o_k, mask=m_k, other=0.).to(tl.float32) * scale
            b_o = tl.sum(b_h * b_q[:, None], axis=0)
            tl.store(o + (tok * HQ + i_hq) * V + o_v, b_o.to(o.dtype.element_ty), mask=m_v)
    if STORE_HT:
        tl.store(ht + i_nh * K * V + o_k[:, None] * V + o_v[None, :], b_h, mask=m_h)


@torch.compiler.disable  # opaque to torch.compile: see t2r/ops/backend.py
def fused_recurrent_gated_delta_rule_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    scale: float | None = None, initial_state: torch.Tensor | None = None,
    output_final_state: bool = False, cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated delta rule step by step (decoding): q [B,T,HQ,K], k [B,T,H,K], v [B,T,H,V], g / beta [B,T,H],
    initial_state [N,H,K,V]; forward only. Same semantics as
    ``t2r.ops.gated_delta.naive.naive_recurrent_gated_delta_rule`` (plus cu_seqlens)."""
    B, T, HQ, K = q.shape
    H, V = v.shape[2], v.shape[3]
    assert HQ % H == 0, "HQ must be a multiple of H"
    if cu_seqlens is not None:
        assert B == 1, "cu_seqlens needs B == 1"
        cu_seqlens = cu_seqlens.to(torch.int32).contiguous()
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    scale = K ** -0.5 if scale is None else scale
    q, k, v, g, beta = (t.contiguous() for t in (q, k, v, g, beta))
    o = torch.empty(B, T, HQ, V, dtype=v.dtype, device=v.device)
    ht = torch.empty(N, H, K, V, dtype=torch.float32, device=v.device) if output_final_state else None
    h0 = initial_state.contiguous() if initial_state is not None else None
    BK = max(16, next_pow2(K))
    BV = min(32, max(16, next_pow2(V))) if BK <= 128 else 16
    _recurrent_fwd_kernel[(triton.cdiv(V, BV), N * H)](
        q, k, v, g, beta, o, h0, ht, cu_seqlens, float(scale), T,
        HQ=HQ, H=H, K=K, V=V, BK=BK, BV=BV, USE_H0=h0 is not None, STORE_HT=output_final_state,
        IS_VARLEN=cu_seqlens is not None, num_warps=4, num_stages=1)
    return o, ht
