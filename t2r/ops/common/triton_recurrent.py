"""Triton recurrent step shared by GLA and simple GLA: decoding (T small), state in, state out.

One program per (V-block, sequence * kv head) holds the fp32 state S [K, BV] in registers and
walks the T steps: S = Diag(exp g_t) S + k_t v_t^T, then o_t = scale * S^T q_t for each of the
query heads of its GQA group (the state is read and written once per call, not per q head).
Forward only (no autograd): decoding needs no gradients; training uses the chunk kernels.
"""
import torch
import triton
import triton.language as tl

from ..triton_utils import next_pow2

__all__ = ["fused_recurrent_linear_attn_triton"]


@triton.jit
def _recurrent_fwd_kernel(
    q, k, v, g, o, h0, ht, cu_seqlens, scale, T,
    HQ: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
    SCALAR: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr, IS_VARLEN: tl.constexpr,
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
    m_k = o_k < K
    m_v = o_v < V
    m_h = m_k[:, None] & m_v[None, :]
    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        b_h += tl.load(h0 + i_nh * K * V + o_k[:, None] * V + o_v[None, :], mask=m_h, other=0.).to(tl.float32)
    for t in range(T):
        tok = bos + t
        b_k = tl.load(k + (tok * H + i_h) * K + o_k, mask=m_k, other=0.).to(tl.float32)
        b_v = tl.load(v + (tok * H + i_h) * V + o_v, mask=m_v, other=0.).to(tl.float32)
        if SCALAR:
            b_g = tl.load(g + tok * H + i_h).to(tl.float32)
            b_h = b_h * tl.exp(b_g)
        else:
            b_g = tl.load(g + (tok * H + i_h) * K + o_k, mask=m_k, other=0.).to(tl.float32)
            b_h = b_h * tl.exp(b_g)[:, None]
        b_h += b_k[:, None] * b_v[None, :]
        for i_g in tl.static_range(G):
            i_hq = i_h * G + i_g
            b_q = tl.load(q + (tok * HQ + i_hq) * K + o_k, mask=m_k, other=0.).to(tl.float32) * scale
            b_o = tl.sum(b_h * b_q[:, None], axis=0)
            tl.store(o + (tok * HQ + i_hq) * V + o_v, b_o.to(o.dtype.element_ty), mask=m_v)
    if STORE_HT:
        tl.store(ht + i_nh * K * V + o_k[:, None] * V + o_v[None, :], b_h, mask=m_h)


@torch.compiler.disable  # opaque to torch.compile: see t2r/ops/backend.py
def fused_recurrent_linear_attn_triton(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, scalar):
    """Shared entry of t2r.ops.gla's fused_recurrent_gla_triton (scalar=False, g [B,T,H,K]) and
    t2r.ops.simple_gla's fused_recurrent_simple_gla_triton (scalar=True, g [B,T,H])."""
    B, T, HQ, K = q.shape
    H, V = v.shape[2], v.shape[3]
    assert HQ % H == 0
    if cu_seqlens is not None:
        assert B == 1, "cu_seqlens needs B == 1"
        cu_seqlens = cu_seqlens.to(torch.int32).contiguous()
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    scale = K ** -0.5 if scale is None else scale
    q, k, v, g = (t.contiguous() for t in (q, k, v, g))
    o = torch.empty(B, T, HQ, V, dtype=v.dtype, device=v.device)
    ht = torch.empty(N, H, K, V, dtype=torch.float32, device=v.device) if output_final_state else None
    h0 = initial_state.contiguous() if initial_state is not None else None
    BK = max(16, next_pow2(K))
    BV = min(32, max(16, next_pow2(V))) if BK <= 128 else 16
    _recurrent_fwd_kernel[(triton.cdiv(V, BV), N * H)](
        q, k, v, g, o, h0, ht, cu_seqlens, float(scale), T,
        HQ=HQ, H=H, K=K, V=V, BK=BK, BV=BV, SCALAR=scalar, USE_H0=h0 is not None,
        STORE_HT=output_final_state, IS_VARLEN=cu_seqlens is not None, num_warps=4, num_stages=1)
    return o, ht
