"""Triton per-chunk output kernels of the gated delta rule (see triton_chunk.py), fully parallel over chunks:
the forward output and the backward dq, dk and gate gradient. With S the state entering the chunk, dS the
gradient of the state leaving it, U the new values and E_ij = exp(b_i - b_j) (j <= i):

    O_g  = scale [ diag(gamma) Q_g S + (Q_g K^T (.) E) U ]
    dQ_g = scale [ (dO_g U^T (.) E) K + diag(gamma) dO_g S^T ]
    dK  += sum_g scale (dO_g U^T (.) E)^T Q_g + exp(b_C - b) (.) U dS^T + (dG + dG^T) K

(dG from triton_wy.py), and the gate-cumsum gradient db collects every exp above; the gate gradient is its
reverse cumsum inside the chunk (b is the cumsum inside the chunk). Transposed operands are loaded
transposed, never made with tl.trans (see triton_wy.py)."""
import triton
import triton.language as tl

from ..triton_utils import chunk_bounds
from .triton_wy import _decay, _last_row, _rows


@triton.jit(do_not_specialize=["T"])
def _fwd_o_kernel(
    q, k, u, bcum, h, o, cu_seqlens, chunk_indices, scale, T,
    HQ: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    i_v, i_tc, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_hq = i_bh // HQ, i_bh % HQ
    i_h = i_hq // (HQ // H)
    i_t, bos, T, i_c = chunk_bounds(i_tc, i_b, T, cu_seqlens, chunk_indices, BT, IS_VARLEN)
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    b_s = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        p_q = tl.make_block_ptr(q + (bos * HQ + i_hq) * K, (T, K), (HQ * K, 1), (i_t * BT, i_k * BK), (BT, BK), (1, 0))
        p_kt = tl.make_block_ptr(k + (bos * H + i_h) * K, (K, T), (1, H * K), (i_k * BK, i_t * BT), (BK, BT), (0, 1))
        p_h = tl.make_block_ptr(h + (i_c * H + i_h) * K * V, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
        b_q = tl.load(p_q, boundary_check=(0, 1))
        b_o += tl.dot(b_q, tl.load(p_h, boundary_check=(0, 1)))
        b_s += tl.dot(b_q, tl.load(p_kt, boundary_check=(0, 1)))
    b_b = _rows(bcum, bos, i_h, i_t, T, H, BT)
    p_u = tl.make_block_ptr(u + (bos * H + i_h) * V, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
    b_u = tl.load(p_u, boundary_check=(0, 1))
    b_s = b_s * _decay(b_b, T - i_t * BT, False, False, BT)
    b_o = (b_o * tl.exp(b_b)[:, None] + tl.dot(b_s.to(b_u.dtype), b_u)) * scale
    p_o = tl.make_block_ptr(o + (bos * HQ + i_hq) * V, (T, V), (HQ * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
    tl.store(p_o, b_o.to(p_o.dtype.element_ty), boundary_check=(0, 1))


@triton.jit(do_not_specialize=["T"])
def _bwd_dqk_kernel(
    q, k, u, bcum, h, do, dh, dgram, dk_part, db_part, dq, dk, dg, cu_seqlens, chunk_indices, scale, T,
    HQ: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    i_tc, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    G: tl.constexpr = HQ // H
    i_t, bos, T, i_c = chunk_bounds(i_tc, i_b, T, cu_seqlens, chunk_indices, BT, IS_VARLEN)
    o_i = tl.arange(0, BT)
    o_t = i_t * BT + o_i
    m_t = o_t < T
    b_b = _rows(bcum, bos, i_h, i_t, T, H, BT)
    b_last = _last_row(bcum, bos, i_h, i_t, T, H, BT)
    b_gamma = tl.exp(b_b)
    p_k = tl.make_block_ptr(k + (bos * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, 0), (BT, BK), (1, 0))
    p_kt = tl.make_block_ptr(k + (bos * H + i_h) * K, (K, T), (1, H * K), (0, i_t * BT), (BK, BT), (0, 1))
    b_k = tl.load(p_k, boundary_check=(0, 1))
    b_kt = tl.load(p_kt, boundary_check=(0, 1))
    p_dkp = tl.make_block_ptr(dk_part + (bos * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, 0), (BT, BK), (1, 0))
    b_dk = tl.load(p_dkp, boundary_check=(0, 1))
    b_db = tl.load(db_part + (bos + o_t) * H + i_h, mask=m_t, other=0.)

    # keys written into the state leaving the chunk: S_next = gamma_C S + (K (.) exp(b_C - b))^T U
    b_udh = tl.zeros([BT, BK], dtype=tl.float32)                    # U dS^T
    b_sdh = tl.zeros([BK], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        p_u = tl.make_block_ptr(u + (bos * H + i_h) * V, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
        p_dht = tl.make_block_ptr(dh + (i_c * H + i_h) * K * V, (V, K), (1, V), (i_v * BV, 0), (BV, BK), (0, 1))
        p_h = tl.make_block_ptr(h + (i_c * H + i_h) * K * V, (K, V), (V, 1), (0, i_v * BV), (BK, BV), (1, 0))
        p_dh = tl.make_block_ptr(dh + (i_c * H + i_h) * K * V, (K, V), (V, 1), (0, i_v * BV), (BK, BV), (1, 0))
        b_dht = tl.load(p_dht, boundary_check=(0, 1))
        b_udh += tl.dot(tl.load(p_u, boundary_check=(0, 1)).to(b_dht.dtype), b_dht)
        b_sdh += tl.sum(tl.load(p_h, boundary_check=(0, 1)).to(tl.float32)
                        * tl.load(p_dh, boundary_check=(0, 1)).to(tl.float32), axis=1)
    b_kdecay = tl.where(m_t, tl.exp(b_last - b_b), 0.)
    b_dk += b_udh * b_kdecay[:, None]
    # exp(b_C - b_j) sends +x to db_C and -x to db_j; the last row's pair cancels exactly and is left out
    # (summing it in would bury the small gate gradients of fast-decaying heads under its rounding)
    is_last = o_t == tl.minimum(T, (i_t + 1) * BT) - 1
    b_kd_term = tl.where(is_last, 0., tl.sum(b_udh * b_k.to(tl.float32), axis=1) * b_kdecay)
    b_end = tl.sum(b_kd_term, axis=0) + tl.exp(b_last) * tl.sum(b_sdh, axis=0)
    b_db += tl.where(is_last, b_end, 0.) - b_kd_term

    b_e = _decay(b_b, T - i_t * BT, False, False, BT) * scale
    b_et = _decay(b_b, T - i_t * BT, False, True, BT) * scale
    for i_g in range(G):
        i_hq = i_h * G + i_g
        p_q = tl.make_block_ptr(q + (bos * HQ + i_hq) * K, (T, K), (HQ * K, 1), (i_t * BT, 0), (BT, BK), (1, 0))
        b_q = tl.load(p_q, boundary_check=(0, 1))
        b_dp = tl.zeros([BT, BT], dtype=tl.float32)                 # dO U^T
        b_dpt = tl.zeros([BT, BT], dtype=tl.float32)                # U dO^T
        b_dqs = tl.zeros([BT, BK], dtype=tl.float32)                # dO S^T
        for i_v in range(tl.cdiv(V, BV)):
            p_do = tl.make_block_ptr(do + (bos * HQ + i_hq) * V, (T, V), (HQ * V, 1), (i_t * BT, i_v * BV),
                                     (BT, BV), (1, 0))
            p_dot = tl.make_block_ptr(do + (bos * HQ + i_hq) * V, (V, T), (1, HQ * V), (i_v * BV, i_t * BT),
                                      (BV, BT), (0, 1))
            p_u = tl.make_block_ptr(u + (bos * H + i_h) * V, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV),
                                    (1, 0))
            p_ut = tl.make_block_ptr(u + (bos * H + i_h) * V, (V, T), (1, H * V), (i_v * BV, i_t * BT), (BV, BT),
                                     (0, 1))
            p_ht = tl.make_block_ptr(h + (i_c * H + i_h) * K * V, (V, K), (1, V), (i_v * BV, 0), (BV, BK), (0, 1))
            b_do = tl.load(p_do, boundary_check=(0, 1))
            b_dp += tl.dot(b_do, tl.load(p_ut, boundary_check=(0, 1)).to(b_do.dtype))
            b_dpt += tl.dot(tl.load(p_u, boundary_check=(0, 1)).to(b_do.dtype), tl.load(p_dot, boundary_check=(0, 1)))
            b_dqs += tl.dot(b_do, tl.load(p_ht, boundary_check=(0, 1)).to(b_do.dtype))
        b_ds = b_dp * b_e                                            # dL/d(scores), scores_ij = q_i . k_j
        b_dq = tl.dot(b_ds.to(b_k.dtype), b_k) + b_dqs * (scale * b_gamma)[:, None]
        p_dq = tl.make_block_ptr(dq + (bos * HQ + i_hq) * K, (T, K), (HQ * K, 1), (i_t * BT, 0), (BT, BK), (1, 0))
        tl.store(p_dq, b_dq.to(p_dq.dtype.element_ty), boundary_check=(0, 1))
        b_dk += tl.dot((b_dpt * b_et).to(b_q.dtype), b_q)
        b_z = tl.where(o_i[:, None] != o_i[None, :], b_ds * tl.dot(b_q, b_kt), 0.)   # dP_ij P_ij: d/db_i, -d/db_j
        b_db += tl.sum(b_z, axis=1) - tl.sum(b_z, axis=0) \
            + tl.sum(b_q.to(tl.float32) * b_dqs, axis=1) * scale * b_gamma

    # the Gram matrix G = K K^T of the WY system: dK += dG K + dG^T K
    p_dg = tl.make_block_ptr(dgram + (bos * H + i_h) * BT, (T, BT), (H * BT, 1), (i_t * BT, 0), (BT, BT), (1, 0))
    p_dgt = tl.make_block_ptr(dgram + (bos * H + i_h) * BT, (BT, T), (1, H * BT), (0, i_t * BT), (BT, BT), (0, 1))
    b_k32 = b_k.to(tl.float32)
    b_dk += tl.dot(tl.load(p_dg, boundary_check=(0, 1)), b_k32) + tl.dot(tl.load(p_dgt, boundary_check=(0, 1)), b_k32)
    p_dk = tl.make_block_ptr(dk + (bos * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, 0), (BT, BK), (1, 0))
    tl.store(p_dk, b_dk.to(p_dk.dtype.element_ty), boundary_check=(0, 1))
    b_dg = tl.cumsum(b_db, axis=0, reverse=True)
    tl.store(dg + (bos + o_t) * H + i_h, b_dg.to(dg.dtype.element_ty), mask=m_t)
