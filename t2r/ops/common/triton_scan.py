"""Triton state scans of GLA and simple GLA (see triton_chunk.py): the state entering every
chunk (forward) and the gradient of the state leaving every chunk (backward), sequential over
chunks; long sequences run as parallel segments (triton_utils.segment_of_sequence)."""
import triton
import triton.language as tl

from ..triton_utils import carry_through_segments, segment_of_sequence, seq_bounds, store_segment
from .triton_decay import _LOG2E, _scalar_gate


# --------------------------------------------------------------------------------------
# forward: chunk states
# --------------------------------------------------------------------------------------
@triton.jit
def _fwd_h_kernel(
    k, v, g, h, h0, ht, seg_h, seg_d, cu_seqlens, chunk_offsets, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NS, SPLIT: tl.constexpr,
    SCALAR: tl.constexpr, USE_H0: tl.constexpr, IS_VARLEN: tl.constexpr, SEG_PASS: tl.constexpr,
):
    # one program per (K-block, V-block, sequence x head x segment); NS segments per sequence
    # (triton_utils.segment_of_sequence): SEG_PASS stores each segment's end state from zero and
    # its decay, the other pass the chunk states.
    i_k, i_v, i_nhs = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_nh, i_sg = i_nhs // NS, i_nhs % NS
    i_n, i_h = i_nh // H, i_nh % H
    bos, T, NT, boh = seq_bounds(i_n, T, cu_seqlens, chunk_offsets, BT, IS_VARLEN)
    c_lo, c_hi = segment_of_sequence(i_sg, NT, NS)

    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    if not SEG_PASS:
        if USE_H0:
            p_h0 = tl.make_block_ptr(h0 + i_nh * K * V, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
            b_h += tl.load(p_h0, boundary_check=(0, 1)).to(tl.float32)
        if SPLIT:   # the state carried in through the segments before (after) this one; not compiled unsplit
            b_h = carry_through_segments(b_h, seg_h, seg_d, i_nh * NS, i_sg, 1, K, V, i_k * BK, i_v * BV,
                                         K, BK, BV, True)
    b_dsum = tl.zeros([BK], dtype=tl.float32)

    for i_t in range(c_lo, c_hi):
        if not SEG_PASS:
            p_h = tl.make_block_ptr(h + ((boh + i_t) * H + i_h) * K * V, (K, V), (V, 1),
                                    (i_k * BK, i_v * BV), (BK, BV), (1, 0))
            tl.store(p_h, b_h.to(p_h.dtype.element_ty), boundary_check=(0, 1))
        p_k = tl.make_block_ptr(k + (bos * H + i_h) * K, (K, T), (1, H * K), (i_k * BK, i_t * BT), (BK, BT), (0, 1))
        p_v = tl.make_block_ptr(v + (bos * H + i_h) * V, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
        b_k = tl.load(p_k, boundary_check=(0, 1))
        b_v = tl.load(p_v, boundary_check=(0, 1))
        if SCALAR:
            b_g = _scalar_gate(g, bos, i_h, i_t, T, H, BT)
            b_b = tl.cumsum(b_g, axis=0)
            b_gl = tl.sum(b_g, axis=0)
            b_h *= tl.exp2(b_gl)
            b_kd = (b_k * tl.exp2(b_gl - b_b)[None, :]).to(b_k.dtype)
        else:
            p_g = tl.make_block_ptr(g + (bos * H + i_h) * K, (K, T), (1, H * K), (i_k * BK, i_t * BT), (BK, BT), (0, 1))
            b_g = tl.load(p_g, boundary_check=(0, 1)).to(tl.float32) * _LOG2E
            b_b = tl.cumsum(b_g, axis=1)
            b_gl = tl.sum(b_g, axis=1)
            b_h *= tl.exp2(b_gl)[:, None]
            b_kd = (b_k * tl.exp2(b_gl[:, None] - b_b)).to(b_k.dtype)
        b_h += tl.dot(b_kd, b_v)
        b_dsum += b_gl

    if SEG_PASS:
        store_segment(b_h, b_dsum, seg_h, seg_d, i_nh * NS + i_sg, K, V, i_k * BK, i_v * BV, K, BK, BV, True, True)
    elif i_sg == NS - 1:
        p_ht = tl.make_block_ptr(ht + i_nh * K * V, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
        tl.store(p_ht, b_h, boundary_check=(0, 1))


# --------------------------------------------------------------------------------------
# backward: state gradients (reverse over chunks), summed over the query-head group
# --------------------------------------------------------------------------------------
@triton.jit
def _bwd_dh_kernel(
    q, g, do, dh, dht, dh0, seg_h, seg_d, cu_seqlens, chunk_offsets, scale, T,
    HQ: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NS, SPLIT: tl.constexpr,
    SCALAR: tl.constexpr, USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr, IS_VARLEN: tl.constexpr,
    SEG_PASS: tl.constexpr,
):
    # the reverse of _fwd_h_kernel's scan, segmented the same way (segments carried last to first)
    i_k, i_v, i_nhs = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_nh, i_sg = i_nhs // NS, i_nhs % NS
    i_n, i_h = i_nh // H, i_nh % H
    G: tl.constexpr = HQ // H
    bos, T, NT, boh = seq_bounds(i_n, T, cu_seqlens, chunk_offsets, BT, IS_VARLEN)
    c_lo, c_hi = segment_of_sequence(i_sg, NT, NS)

    b_dh = tl.zeros([BK, BV], dtype=tl.float32)
    if not SEG_PASS:
        if USE_DHT:
            p_dht = tl.make_block_ptr(dht + i_nh * K * V, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
            b_dh += tl.load(p_dht, boundary_check=(0, 1)).to(tl.float32)
        if SPLIT:   # the state carried in through the segments before (after) this one; not compiled unsplit
            b_dh = carry_through_segments(b_dh, seg_h, seg_d, i_nh * NS + NS - 1, NS - 1 - i_sg, -1, K, V,
                                          i_k * BK, i_v * BV, K, BK, BV, True)
    b_dsum = tl.zeros([BK], dtype=tl.float32)

    for i in range(c_hi - c_lo):
        i_t = c_hi - 1 - i
        if not SEG_PASS:
            p_dh = tl.make_block_ptr(dh + ((boh + i_t) * H + i_h) * K * V, (K, V), (V, 1),
                                     (i_k * BK, i_v * BV), (BK, BV), (1, 0))
            tl.store(p_dh, b_dh.to(p_dh.dtype.element_ty), boundary_check=(0, 1))
        if SCALAR:
            b_g = _scalar_gate(g, bos, i_h, i_t, T, H, BT)
            b_b = tl.cumsum(b_g, axis=0)
            b_gl = tl.sum(b_g, axis=0)
            b_dh *= tl.exp2(b_gl)
            b_e = tl.exp2(b_b)[None, :] * scale
        else:
            p_g = tl.make_block_ptr(g + (bos * H + i_h) * K, (K, T), (1, H * K), (i_k * BK, i_t * BT), (BK, BT), (0, 1))
            b_g = tl.load(p_g, boundary_check=(0, 1)).to(tl.float32) * _LOG2E
            b_b = tl.cumsum(b_g, axis=1)
            b_gl = tl.sum(b_g, axis=1)
            b_dh *= tl.exp2(b_gl)[:, None]
            b_e = tl.exp2(b_b) * scale
        b_dsum += b_gl
        for i_g in range(G):
            i_hq = i_h * G + i_g
            p_q = tl.make_block_ptr(q + (bos * HQ + i_hq) * K, (K, T), (1, HQ * K), (i_k * BK, i_t * BT),
                                    (BK, BT), (0, 1))
            p_do = tl.make_block_ptr(do + (bos * HQ + i_hq) * V, (T, V), (HQ * V, 1), (i_t * BT, i_v * BV),
                                     (BT, BV), (1, 0))
            b_q = tl.load(p_q, boundary_check=(0, 1))
            b_do = tl.load(p_do, boundary_check=(0, 1))
            b_dh += tl.dot((b_q * b_e).to(b_q.dtype), b_do)

    if SEG_PASS:
        store_segment(b_dh, b_dsum, seg_h, seg_d, i_nh * NS + i_sg, K, V, i_k * BK, i_v * BV, K, BK, BV, True, True)
    elif STORE_DH0:
        if i_sg == 0:
            p_dh0 = tl.make_block_ptr(dh0 + i_nh * K * V, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
            tl.store(p_dh0, b_dh, boundary_check=(0, 1))
