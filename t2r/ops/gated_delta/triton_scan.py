"""Triton state scans of the gated delta rule (see triton_chunk.py), sequential over the chunks of each
sequence, one program per (V-block, sequence x kv head) holding a [K, BV] fp32 tile of the state:

    forward:  U = U' - W S,  S <- gamma_C S + (K (.) exp(b_C - b))^T U          (stores S entering each chunk, U)
    backward: dU = sum_g P_g^T dO_g + (K (.) exp(b_C - b)) dS,
              dS <- gamma_C dS + sum_g (scale gamma (.) Q_g)^T dO_g - W^T dU     (stores dS leaving each chunk, dU)

with P_g = scale (Q_g K^T (.) E), j <= i, for the query heads g of the kv head's GQA group.
Transposed operands are loaded transposed (no tl.trans; see triton_wy.py)."""
import triton
import triton.language as tl

from ..triton_utils import seq_bounds
from .triton_wy import _decay, _last_row, _rows


@triton.jit(do_not_specialize=["T"])
def _fwd_h_kernel(
    k, w, u_part, bcum, h, u, h0, ht, cu_seqlens, chunk_offsets, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_H0: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // H, i_nh % H
    bos, T, NT, boh = seq_bounds(i_n, T, cu_seqlens, chunk_offsets, BT, IS_VARLEN)
    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        p_h0 = tl.make_block_ptr(h0 + i_nh * K * V, (K, V), (V, 1), (0, i_v * BV), (BK, BV), (1, 0))
        b_h += tl.load(p_h0, boundary_check=(0, 1)).to(tl.float32)
    for i_t in range(NT):
        p_h = tl.make_block_ptr(h + ((boh + i_t) * H + i_h) * K * V, (K, V), (V, 1), (0, i_v * BV), (BK, BV), (1, 0))
        tl.store(p_h, b_h.to(p_h.dtype.element_ty), boundary_check=(0, 1))
        p_w = tl.make_block_ptr(w + (bos * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, 0), (BT, BK), (1, 0))
        p_up = tl.make_block_ptr(u_part + (bos * H + i_h) * V, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV),
                                 (1, 0))
        p_u = tl.make_block_ptr(u + (bos * H + i_h) * V, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
        b_w = tl.load(p_w, boundary_check=(0, 1))
        b_u = tl.load(p_up, boundary_check=(0, 1)).to(tl.float32) - tl.dot(b_w, b_h.to(b_w.dtype))
        tl.store(p_u, b_u.to(p_u.dtype.element_ty), boundary_check=(0, 1))

        b_b = _rows(bcum, bos, i_h, i_t, T, H, BT)
        b_last = _last_row(bcum, bos, i_h, i_t, T, H, BT)
        o_t = i_t * BT + tl.arange(0, BT)
        p_kt = tl.make_block_ptr(k + (bos * H + i_h) * K, (K, T), (1, H * K), (0, i_t * BT), (BK, BT), (0, 1))
        b_kt = tl.load(p_kt, boundary_check=(0, 1))
        b_kt = (b_kt * tl.where(o_t < T, tl.exp(b_last - b_b), 0.)[None, :]).to(b_kt.dtype)
        b_h = b_h * tl.exp(b_last) + tl.dot(b_kt, b_u.to(b_kt.dtype))
    p_ht = tl.make_block_ptr(ht + i_nh * K * V, (K, V), (V, 1), (0, i_v * BV), (BK, BV), (1, 0))
    tl.store(p_ht, b_h, boundary_check=(0, 1))


@triton.jit(do_not_specialize=["T"])
def _bwd_dh_kernel(
    q, k, w, bcum, do, dh, du, dht, dh0, cu_seqlens, chunk_offsets, scale, T,
    HQ: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // H, i_nh % H
    G: tl.constexpr = HQ // H
    bos, T, NT, boh = seq_bounds(i_n, T, cu_seqlens, chunk_offsets, BT, IS_VARLEN)
    b_dh = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_DHT:
        p_dht = tl.make_block_ptr(dht + i_nh * K * V, (K, V), (V, 1), (0, i_v * BV), (BK, BV), (1, 0))
        b_dh += tl.load(p_dht, boundary_check=(0, 1)).to(tl.float32)
    for i_r in range(NT):
        i_t = NT - 1 - i_r
        p_dh = tl.make_block_ptr(dh + ((boh + i_t) * H + i_h) * K * V, (K, V), (V, 1), (0, i_v * BV), (BK, BV),
                                 (1, 0))
        tl.store(p_dh, b_dh.to(p_dh.dtype.element_ty), boundary_check=(0, 1))
        b_b = _rows(bcum, bos, i_h, i_t, T, H, BT)
        b_last = _last_row(bcum, bos, i_h, i_t, T, H, BT)
        o_t = i_t * BT + tl.arange(0, BT)
        p_k = tl.make_block_ptr(k + (bos * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, 0), (BT, BK), (1, 0))
        b_k = tl.load(p_k, boundary_check=(0, 1))
        b_kd = (b_k * tl.where(o_t < T, tl.exp(b_last - b_b), 0.)[:, None]).to(b_k.dtype)
        b_du = tl.dot(b_kd, b_dh.to(b_k.dtype))
        b_dq_state = tl.zeros([BK, BV], dtype=tl.float32)
        b_decay_t = _decay(b_b, T - i_t * BT, False, True, BT) * scale   # [j, i]: scale exp(b_i - b_j), i >= j
        for i_g in range(G):
            i_hq = i_h * G + i_g
            p_qt = tl.make_block_ptr(q + (bos * HQ + i_hq) * K, (K, T), (1, HQ * K), (0, i_t * BT), (BK, BT), (0, 1))
            p_do = tl.make_block_ptr(do + (bos * HQ + i_hq) * V, (T, V), (HQ * V, 1), (i_t * BT, i_v * BV), (BT, BV),
                                     (1, 0))
            b_qt = tl.load(p_qt, boundary_check=(0, 1))
            b_do = tl.load(p_do, boundary_check=(0, 1))
            b_pt = tl.dot(b_k, b_qt) * b_decay_t                     # P^T [j, i]
            b_du += tl.dot(b_pt.to(b_do.dtype), b_do)
            b_qs = (b_qt * (scale * tl.exp(b_b))[None, :]).to(b_do.dtype)
            b_dq_state += tl.dot(b_qs, b_do)
        p_du = tl.make_block_ptr(du + (bos * H + i_h) * V, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
        tl.store(p_du, b_du, boundary_check=(0, 1))
        p_wt = tl.make_block_ptr(w + (bos * H + i_h) * K, (K, T), (1, H * K), (0, i_t * BT), (BK, BT), (0, 1))
        b_wt = tl.load(p_wt, boundary_check=(0, 1))
        b_dh = b_dh * tl.exp(b_last) + b_dq_state - tl.dot(b_wt, b_du.to(b_wt.dtype))
    if STORE_DH0:
        p_dh0 = tl.make_block_ptr(dh0 + i_nh * K * V, (K, V), (V, 1), (0, i_v * BV), (BK, BV), (1, 0))
        tl.store(p_dh0, b_dh, boundary_check=(0, 1))
