"""Triton step-by-step GSA for decoding (few steps, no autograd).

One program per (sequence, kv head) keeps both slot memories, K~ [K, M] and V~ [M, V],
in fp32 registers across the steps and serves every query head of its GQA group from
them, so one decode step reads and writes each state exactly once and never repeats
k, v, s, g or the states per query head.
"""

import torch
import triton
import triton.language as tl

from ..triton_utils import next_pow2

__all__ = ["fused_recurrent_gsa_triton", "fused_recurrent_gsa_step"]


@triton.jit
def _fused_recurrent_gsa_kernel(
    q, k, v, s, g, o, h0k, h0v, htk, htv, cu_seqlens, scale, T,
    HQ: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, M: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BM: tl.constexpr,
    USE_H0: tl.constexpr, STORE_HT: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    i_nh = tl.program_id(0)
    i_n, i_h = i_nh // H, i_nh % H
    G: tl.constexpr = HQ // H
    if IS_VARLEN:
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
        T = (eos - bos).to(tl.int32)
    else:
        bos = (i_n * T).to(tl.int64)
    o_k, o_v, o_m = tl.arange(0, BK), tl.arange(0, BV), tl.arange(0, BM)
    m_k, m_v, m_m = o_k < K, o_v < V, o_m < M
    m_km = m_k[:, None] & m_m[None, :]
    m_mv = m_m[:, None] & m_v[None, :]
    b_hk = tl.zeros([BK, BM], dtype=tl.float32)
    b_hv = tl.zeros([BM, BV], dtype=tl.float32)
    if USE_H0:
        b_hk += tl.load(h0k + i_nh * K * M + o_k[:, None] * M + o_m[None, :], mask=m_km, other=0.).to(tl.float32)
        b_hv += tl.load(h0v + i_nh * M * V + o_m[:, None] * V + o_v[None, :], mask=m_mv, other=0.).to(tl.float32)
    for t in range(T):
        row = bos + t
        b_g = tl.load(g + (row * H + i_h) * M + o_m, mask=m_m, other=0.).to(tl.float32)
        b_s = tl.load(s + (row * H + i_h) * M + o_m, mask=m_m, other=0.).to(tl.float32)
        b_k = tl.load(k + (row * H + i_h) * K + o_k, mask=m_k, other=0.).to(tl.float32)
        b_v = tl.load(v + (row * H + i_h) * V + o_v, mask=m_v, other=0.).to(tl.float32)
        b_d = tl.exp(b_g)
        b_hk = b_hk * b_d[None, :] + b_k[:, None] * b_s[None, :]
        b_hv = b_hv * b_d[:, None] + b_s[:, None] * b_v[None, :]
        for i_g in tl.static_range(G):
            i_hq = i_h * G + i_g
            b_q = tl.load(q + (row * HQ + i_hq) * K + o_k, mask=m_k, other=0.).to(tl.float32) * scale
            b_z = tl.sum(b_q[:, None] * b_hk, axis=0)
            b_z = tl.where(m_m, b_z, float("-inf"))
            b_e = tl.exp(b_z - tl.max(b_z, axis=0))
            b_p = b_e / tl.sum(b_e, axis=0)
            b_o = tl.sum(b_p[:, None] * b_hv, axis=0)
            tl.store(o + (row * HQ + i_hq) * V + o_v, b_o.to(o.dtype.element_ty), mask=m_v)
    if STORE_HT:
        tl.store(htk + i_nh * K * M + o_k[:, None] * M + o_m[None, :], b_hk, mask=m_km)
        tl.store(htv + i_nh * M * V + o_m[:, None] * V + o_v[None, :], b_hv, mask=m_mv)


@torch.compiler.disable  # opaque to torch.compile: see t2r/ops/backend.py
def fused_recurrent_gsa_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    s: torch.Tensor,
    g: torch.Tensor,
    scale: float | None = None,
    initial_state: tuple[torch.Tensor, torch.Tensor] | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """Step-by-step GSA (inference only, no autograd); same contract as `t2r.ops.gsa`.

    Meant for decoding (a few steps per call); the cost grows linearly with T and the
    steps of one sequence run one after another.
    """
    B, T, HQ, K = q.shape
    H, V, M = k.shape[2], v.shape[3], s.shape[3]
    scale = K ** -0.5 if scale is None else float(scale)
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    q, k, v, s, g = (t.contiguous() for t in (q, k, v, s, g))
    use_h0 = initial_state is not None
    if use_h0:
        h0k, h0v = (t.contiguous() for t in initial_state)
    o = torch.empty(B, T, HQ, V, dtype=v.dtype, device=q.device)
    htk = q.new_empty(N, H, K, M, dtype=torch.float32) if output_final_state else None
    htv = q.new_empty(N, H, M, V, dtype=torch.float32) if output_final_state else None
    if cu_seqlens is not None:
        cu_seqlens = cu_seqlens.to(device=q.device, dtype=torch.int32).contiguous()
    BK, BV, BM = next_pow2(K), next_pow2(V), next_pow2(M)
    num_warps = 8 if BK * BM + BM * BV >= 8192 else 4
    _fused_recurrent_gsa_kernel[(N * H,)](
        q, k, v, s, g, o, h0k if use_h0 else o, h0v if use_h0 else o,
        htk if output_final_state else o, htv if output_final_state else o, cu_seqlens, scale, T,
        HQ=HQ, H=H, K=K, V=V, M=M, BK=BK, BV=BV, BM=BM, USE_H0=use_h0,
        STORE_HT=output_final_state, IS_VARLEN=cu_seqlens is not None, num_warps=num_warps,
    )
    return o, ((htk, htv) if output_final_state else None)


def fused_recurrent_gsa_step(q, k, v, s, g, state, scale=None):
    """One decoding call: (o, new_state) from the state pair (K~, V~) (None for empty)."""
    return fused_recurrent_gsa_triton(q, k, v, s, g, scale=scale, initial_state=state, output_final_state=True)
