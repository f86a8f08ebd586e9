"""Triton per-chunk kernels of GLA and simple GLA (see triton_chunk.py), fully parallel over
chunks: the forward outputs and the backward dv and dq / dk / gate-gradient kernels."""
import triton
import triton.language as tl

from ..triton_utils import chunk_bounds, fits_one_anchor
from .triton_decay import _CLAMP, _LOG2E, _anchored, _gated_scores, _scalar_gate


# --------------------------------------------------------------------------------------
# forward: outputs
# --------------------------------------------------------------------------------------
@triton.jit
def _fwd_o_kernel(
    q, k, v, g, h, o, cu_seqlens, chunk_indices, scale, T,
    HQ: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BS: tl.constexpr,
    SCALAR: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    i_v, i_tg, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_hq = i_bh // HQ, i_bh % HQ
    i_h = i_hq // (HQ // H)
    i_t, bos, T, i_c = chunk_bounds(i_tg, i_b, T, cu_seqlens, chunk_indices, BT, IS_VARLEN)

    o_i = tl.arange(0, BT)
    m_s = o_i[:, None] >= o_i[None, :]
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    if SCALAR:
        b_b = tl.cumsum(_scalar_gate(g, bos, i_h, i_t, T, H, BT), axis=0)
    for i_k in range(tl.cdiv(K, BK)):
        p_q = tl.make_block_ptr(q + (bos * HQ + i_hq) * K, (T, K), (HQ * K, 1), (i_t * BT, i_k * BK), (BT, BK), (1, 0))
        p_k = tl.make_block_ptr(k + (bos * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, i_k * BK), (BT, BK), (1, 0))
        p_h = tl.make_block_ptr(h + (i_c * H + i_h) * K * V, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
        b_q = tl.load(p_q, boundary_check=(0, 1))
        b_k = tl.load(p_k, boundary_check=(0, 1))
        b_h = tl.load(p_h, boundary_check=(0, 1))
        b_qs = b_q.to(tl.float32) * scale
        if SCALAR:
            b_o += tl.dot((b_qs * tl.exp2(b_b)[:, None]).to(b_q.dtype), b_h)
            b_A += tl.dot(b_qs.to(b_q.dtype), tl.trans(b_k))
        else:
            p_g = tl.make_block_ptr(g + (bos * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, i_k * BK), (BT, BK), (1, 0))
            b_b = tl.cumsum(tl.load(p_g, boundary_check=(0, 1)).to(tl.float32) * _LOG2E, axis=0)
            b_o += tl.dot((b_qs * tl.exp2(b_b)).to(b_q.dtype), b_h)
            b_A = _gated_scores(b_A, b_qs, b_k, b_b, BT, BS, False)
    if SCALAR:
        b_A = tl.where(m_s, b_A * tl.exp2(b_b[:, None] - b_b[None, :]), 0.)
    else:
        b_A = tl.where(m_s, b_A, 0.)
    p_v = tl.make_block_ptr(v + (bos * H + i_h) * V, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
    b_v = tl.load(p_v, boundary_check=(0, 1))
    b_o += tl.dot(b_A.to(b_v.dtype), b_v)
    p_o = tl.make_block_ptr(o + (bos * HQ + i_hq) * V, (T, V), (HQ * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
    tl.store(p_o, b_o.to(p_o.dtype.element_ty), boundary_check=(0, 1))


# --------------------------------------------------------------------------------------
# backward: dv, per kv head (sums A^T @ do over the group)
# --------------------------------------------------------------------------------------
@triton.jit
def _bwd_dv_kernel(
    q, k, g, do, dh, dv, cu_seqlens, chunk_indices, scale, T,
    HQ: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BS: tl.constexpr,
    SCALAR: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    i_v, i_tg, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    G: tl.constexpr = HQ // H
    i_t, bos, T, i_c = chunk_bounds(i_tg, i_b, T, cu_seqlens, chunk_indices, BT, IS_VARLEN)

    o_i = tl.arange(0, BT)
    m_t = o_i[:, None] <= o_i[None, :]   # [j, i]: key j <= query i
    b_dv = tl.zeros([BT, BV], dtype=tl.float32)
    if SCALAR:
        b_g = _scalar_gate(g, bos, i_h, i_t, T, H, BT)
        b_b = tl.cumsum(b_g, axis=0)
        b_gl = tl.sum(b_g, axis=0)
    # inter-chunk: dv += (k * 2^(b_last - b)) @ dh_c
    for i_k in range(tl.cdiv(K, BK)):
        p_k = tl.make_block_ptr(k + (bos * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, i_k * BK), (BT, BK), (1, 0))
        p_dh = tl.make_block_ptr(dh + (i_c * H + i_h) * K * V, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
        b_k = tl.load(p_k, boundary_check=(0, 1))
        b_dh = tl.load(p_dh, boundary_check=(0, 1))
        if SCALAR:
            b_kd = b_k * tl.exp2(b_gl - b_b)[:, None]
        else:
            p_g = tl.make_block_ptr(g + (bos * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, i_k * BK), (BT, BK), (1, 0))
            b_g = tl.load(p_g, boundary_check=(0, 1)).to(tl.float32) * _LOG2E
            b_b = tl.cumsum(b_g, axis=0)
            b_gl = tl.sum(b_g, axis=0)
            b_kd = b_k * tl.exp2(b_gl[None, :] - b_b)
        b_dv += tl.dot(b_kd.to(b_k.dtype), b_dh)
    # intra-chunk: dv += A^T @ do, per query head of the group
    for i_g in range(G):
        i_hq = i_h * G + i_g
        b_At = tl.zeros([BT, BT], dtype=tl.float32)
        for i_k in range(tl.cdiv(K, BK)):
            p_q = tl.make_block_ptr(q + (bos * HQ + i_hq) * K, (T, K), (HQ * K, 1), (i_t * BT, i_k * BK),
                                    (BT, BK), (1, 0))
            p_k = tl.make_block_ptr(k + (bos * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, i_k * BK), (BT, BK), (1, 0))
            b_q = tl.load(p_q, boundary_check=(0, 1))
            b_k = tl.load(p_k, boundary_check=(0, 1))
            b_qs = b_q.to(tl.float32) * scale
            if SCALAR:
                b_At += tl.dot(b_k, tl.trans(b_qs.to(b_q.dtype)))
            else:
                p_g = tl.make_block_ptr(g + (bos * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, i_k * BK),
                                        (BT, BK), (1, 0))
                b_b = tl.cumsum(tl.load(p_g, boundary_check=(0, 1)).to(tl.float32) * _LOG2E, axis=0)
                b_At = _gated_scores(b_At, b_qs, b_k, b_b, BT, BS, True)
        if SCALAR:
            b_At = tl.where(m_t, b_At * tl.exp2(b_b[None, :] - b_b[:, None]), 0.)
        else:
            b_At = tl.where(m_t, b_At, 0.)
        p_do = tl.make_block_ptr(do + (bos * HQ + i_hq) * V, (T, V), (HQ * V, 1), (i_t * BT, i_v * BV),
                                 (BT, BV), (1, 0))
        b_do = tl.load(p_do, boundary_check=(0, 1))
        b_dv += tl.dot(b_At.to(b_do.dtype), b_do)
    p_dv = tl.make_block_ptr(dv + (bos * H + i_h) * V, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
    tl.store(p_dv, b_dv.to(p_dv.dtype.element_ty), boundary_check=(0, 1))


# --------------------------------------------------------------------------------------
# backward: dq (per query head), dk and dG (summed over the group), per kv head
# --------------------------------------------------------------------------------------
@triton.jit
def _bwd_dqk_kernel(
    q, k, v, g, h, do, dh, dq, dk, dG, cu_seqlens, chunk_indices, scale, T,
    HQ: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BS: tl.constexpr,
    SCALAR: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    i_k, i_tg, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    G: tl.constexpr = HQ // H
    i_t, bos, T, i_c = chunk_bounds(i_tg, i_b, T, cu_seqlens, chunk_indices, BT, IS_VARLEN)

    # The diagonal of dA (i == j, decay 1) is kept out of the dG sums and added to dq/dk
    # afterwards: its q*dq and k*dk parts cancel exactly, in fp32 they would not.
    o_i = tl.arange(0, BT)
    m_s = o_i[:, None] > o_i[None, :]
    m_t = o_i[:, None] < o_i[None, :]
    m_d = o_i[:, None] == o_i[None, :]
    p_k = tl.make_block_ptr(k + (bos * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, i_k * BK), (BT, BK), (1, 0))
    b_k = tl.load(p_k, boundary_check=(0, 1))
    if SCALAR:
        b_g = _scalar_gate(g, bos, i_h, i_t, T, H, BT)
        b_b = tl.cumsum(b_g, axis=0)
        b_gl = tl.sum(b_g, axis=0)
        b_dG = tl.zeros([BT], dtype=tl.float32)
    else:
        p_g = tl.make_block_ptr(g + (bos * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, i_k * BK), (BT, BK), (1, 0))
        b_g = tl.load(p_g, boundary_check=(0, 1)).to(tl.float32) * _LOG2E
        b_b = tl.cumsum(b_g, axis=0)
        b_gl = tl.sum(b_g, axis=0)
        b_dG = tl.zeros([BT, BK], dtype=tl.float32)
        # single-anchor factors, shared by the group's query heads (used when one_anchor)
        one_anchor = fits_one_anchor(b_b)
        e_q1, e_k1 = _anchored(b_b, BT)
        b_ka1 = (b_k * e_k1).to(b_k.dtype)

    # inter-chunk part of dk: (v @ dh_c^T) * 2^(b_last - b)
    b_dk = tl.zeros([BT, BK], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        p_v = tl.make_block_ptr(v + (bos * H + i_h) * V, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
        p_dh = tl.make_block_ptr(dh + (i_c * H + i_h) * K * V, (V, K), (1, V), (i_v * BV, i_k * BK), (BV, BK), (0, 1))
        b_dk += tl.dot(tl.load(p_v, boundary_check=(0, 1)), tl.load(p_dh, boundary_check=(0, 1)))
    if SCALAR:
        b_dk *= tl.exp2(b_gl - b_b)[:, None]
    else:
        b_dk *= tl.exp2(b_gl[None, :] - b_b)

    b_dkd = tl.zeros([BT, BK], dtype=tl.float32)
    for i_g in range(G):
        i_hq = i_h * G + i_g
        p_q = tl.make_block_ptr(q + (bos * HQ + i_hq) * K, (T, K), (HQ * K, 1), (i_t * BT, i_k * BK), (BT, BK), (1, 0))
        b_q = tl.load(p_q, boundary_check=(0, 1))
        b_dq = tl.zeros([BT, BK], dtype=tl.float32)
        b_dA = tl.zeros([BT, BT], dtype=tl.float32)
        b_dAt = tl.zeros([BT, BT], dtype=tl.float32)
        for i_v in range(tl.cdiv(V, BV)):
            p_v = tl.make_block_ptr(v + (bos * H + i_h) * V, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
            p_do = tl.make_block_ptr(do + (bos * HQ + i_hq) * V, (T, V), (HQ * V, 1), (i_t * BT, i_v * BV),
                                     (BT, BV), (1, 0))
            p_h = tl.make_block_ptr(h + (i_c * H + i_h) * K * V, (V, K), (1, V), (i_v * BV, i_k * BK), (BV, BK), (0, 1))
            b_v = tl.load(p_v, boundary_check=(0, 1))
            b_do = tl.load(p_do, boundary_check=(0, 1))
            b_h = tl.load(p_h, boundary_check=(0, 1))
            b_dq += tl.dot(b_do, b_h)
            b_dA += tl.dot(b_do, tl.trans(b_v))
            b_dAt += tl.dot(b_v, tl.trans(b_do))
        b_qs = b_q.to(tl.float32) * scale
        b_dAd = tl.sum(tl.where(m_d, b_dA, 0.), axis=1)
        if SCALAR:
            b_dq *= tl.exp2(b_b)[:, None]
            b_dA = tl.where(m_s, b_dA * tl.exp2(b_b[:, None] - b_b[None, :]), 0.)
            b_dq += tl.dot(b_dA.to(b_k.dtype), b_k)
            b_dAt = tl.where(m_t, b_dAt * tl.exp2(b_b[None, :] - b_b[:, None]), 0.)
            b_dk += tl.dot(b_dAt.to(b_q.dtype), b_qs.to(b_q.dtype))
            b_dq *= scale
            b_dG += tl.sum(b_q.to(tl.float32) * b_dq, axis=1)
        else:
            b_dq *= tl.exp2(b_b)
            b_dA = tl.where(m_s, b_dA, 0.)
            b_dAt = tl.where(m_t, b_dAt, 0.)
            if one_anchor:
                b_dq += tl.dot(b_dA.to(b_k.dtype), b_ka1) * e_q1
                b_dk += tl.dot(b_dAt.to(b_q.dtype), (b_qs * e_q1).to(b_q.dtype)) * e_k1
            else:
                for s in tl.static_range(BT // BS):
                    b_ba = tl.sum(tl.where((o_i == s * BS + BS // 2)[:, None], b_b, 0.), axis=0)
                    m_q = (o_i >= s * BS) & (o_i < s * BS + BS)
                    m_k = o_i < s * BS + BS
                    e_q = tl.exp2(tl.minimum(b_b - b_ba[None, :], _CLAMP))
                    e_k = tl.exp2(tl.minimum(b_ba[None, :] - b_b, _CLAMP))
                    b_ka = tl.where(m_k[:, None], b_k * e_k, 0.)
                    b_qa = tl.where(m_q[:, None], b_qs * e_q, 0.)
                    b_dqs = tl.dot(tl.where(m_q[:, None], b_dA, 0.).to(b_k.dtype), b_ka.to(b_k.dtype))
                    b_dq += tl.where(m_q[:, None], b_dqs * e_q, 0.)
                    b_dks = tl.dot(tl.where(m_q[None, :], b_dAt, 0.).to(b_q.dtype), b_qa.to(b_q.dtype))
                    b_dk += tl.where(m_k[:, None], b_dks * e_k, 0.)
            b_dq *= scale
            b_dG += b_q.to(tl.float32) * b_dq
        b_dq += b_dAd[:, None] * b_k.to(tl.float32) * scale
        b_dkd += b_dAd[:, None] * b_qs
        p_dq = tl.make_block_ptr(dq + (bos * HQ + i_hq) * K, (T, K), (HQ * K, 1), (i_t * BT, i_k * BK),
                                 (BT, BK), (1, 0))
        tl.store(p_dq, b_dq.to(p_dq.dtype.element_ty), boundary_check=(0, 1))

    p_dk = tl.make_block_ptr(dk + (bos * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, i_k * BK), (BT, BK), (1, 0))
    tl.store(p_dk, (b_dk + b_dkd).to(p_dk.dtype.element_ty), boundary_check=(0, 1))
    if SCALAR:
        b_dG -= tl.sum(b_k.to(tl.float32) * b_dk, axis=1)
        o_t = i_t * BT + o_i
        tl.store(dG + (bos + o_t) * H + i_h, b_dG, mask=o_t < T)
    else:
        b_dG -= b_k.to(tl.float32) * b_dk
        p_dG = tl.make_block_ptr(dG + (bos * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, i_k * BK), (BT, BK), (1, 0))
        tl.store(p_dG, b_dG, boundary_check=(0, 1))
