"""Triton state scans of GSA (see triton_chunk.py): the slot memories entering every chunk
(forward) and the gradients of the memories leaving every chunk (backward), sequential over
chunks; long sequences run as parallel segments (triton_utils.segment_of_sequence)."""
import triton
import triton.language as tl

from ..triton_utils import carry_through_segments, segment_of_sequence, seq_bounds, store_segment
from .triton_common import _LOG2E, _dot, _gate_cumsum, _load_rows, _load_rows_t


# --------------------------------------------------------------------------------------
# forward: slot memories entering each chunk
# --------------------------------------------------------------------------------------
@triton.jit
def _fwd_h_kernel(
    k, v, s, g, hk, hv, h0k, h0v, htk, htv, seg_hk, seg_hv, seg_d, cu_seqlens, chunk_offsets, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, M: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BM: tl.constexpr, NK: tl.constexpr,
    NS, SPLIT: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr, IS_VARLEN: tl.constexpr,
    SEG_PASS: tl.constexpr,
):
    # programs [0, NK): key-slot memory rows [i*BK, +BK); [NK, NK+NV): value columns; NS segments
    # per sequence (triton_utils.segment_of_sequence): SEG_PASS stores each segment's end state
    # from zero and its slot decay, the other pass the chunk states.
    i_s, i_nhs = tl.program_id(0), tl.program_id(1)
    i_nh, i_sg = i_nhs // NS, i_nhs % NS
    i_n, i_h = i_nh // H, i_nh % H
    bos, T, NT, boh = seq_bounds(i_n, T, cu_seqlens, chunk_offsets, BT, IS_VARLEN)
    c_lo, c_hi = segment_of_sequence(i_sg, NT, NS)
    b_dsum = tl.zeros([BM], dtype=tl.float32)
    if i_s < NK:
        i_k = i_s
        b_h = tl.zeros([BK, BM], dtype=tl.float32)
        if not SEG_PASS:
            if USE_H0:
                p0 = tl.make_block_ptr(h0k + i_nh * K * M, (K, M), (M, 1), (i_k * BK, 0), (BK, BM), (1, 0))
                b_h += tl.load(p0, boundary_check=(0, 1)).to(tl.float32)
            if SPLIT:   # the state carried in through the segments before (after) this one; not compiled unsplit
                b_h = carry_through_segments(b_h, seg_hk, seg_d, i_nh * NS, i_sg, 1, K, M, i_k * BK, 0,
                                             M, BK, BM, False)
        for i_t in range(c_lo, c_hi):
            if not SEG_PASS:
                p_h = tl.make_block_ptr(hk + ((boh + i_t) * H + i_h) * K * M, (K, M), (M, 1),
                                        (i_k * BK, 0), (BK, BM), (1, 0))
                tl.store(p_h, b_h.to(p_h.dtype.element_ty), boundary_check=(0, 1))
            b_b = _gate_cumsum(g, bos, i_t, T, i_h, H, M, BT, BM)
            b_bl = tl.sum(tl.where((tl.arange(0, BT) == BT - 1)[:, None], b_b, 0.), axis=0)
            b_s = _load_rows(s, bos, i_t, T, i_h, H, M, BT, BM).to(tl.float32)
            p_k = tl.make_block_ptr(k + (bos * H + i_h) * K, (K, T), (1, H * K), (i_k * BK, i_t * BT), (BK, BT), (0, 1))
            b_kt = tl.load(p_k, boundary_check=(0, 1))
            b_sd = (b_s * tl.exp2(b_bl[None, :] - b_b)).to(b_kt.dtype)
            b_h = b_h * tl.exp2(b_bl)[None, :] + _dot(b_kt, b_sd)
            b_dsum += b_bl
        if SEG_PASS:
            store_segment(b_h, b_dsum, seg_hk, seg_d, i_nh * NS + i_sg, K, M, i_k * BK, 0, M, BK, BM, False, True)
        elif STORE_HT:
            if i_sg == NS - 1:
                pt = tl.make_block_ptr(htk + i_nh * K * M, (K, M), (M, 1), (i_k * BK, 0), (BK, BM), (1, 0))
                tl.store(pt, b_h, boundary_check=(0, 1))
    else:
        i_v = i_s - NK
        b_hv = tl.zeros([BM, BV], dtype=tl.float32)
        if not SEG_PASS:
            if USE_H0:
                p0v = tl.make_block_ptr(h0v + i_nh * M * V, (M, V), (V, 1), (0, i_v * BV), (BM, BV), (1, 0))
                b_hv += tl.load(p0v, boundary_check=(0, 1)).to(tl.float32)
            if SPLIT:   # the state carried in through the segments before (after) this one; not compiled unsplit
                b_hv = carry_through_segments(b_hv, seg_hv, seg_d, i_nh * NS, i_sg, 1, M, V, 0, i_v * BV,
                                              M, BM, BV, True)
        for i_t in range(c_lo, c_hi):
            if not SEG_PASS:
                p_hv = tl.make_block_ptr(hv + ((boh + i_t) * H + i_h) * M * V, (M, V), (V, 1),
                                         (0, i_v * BV), (BM, BV), (1, 0))
                tl.store(p_hv, b_hv.to(p_hv.dtype.element_ty), boundary_check=(0, 1))
            b_gt = _load_rows_t(g, bos, i_t, T, i_h, H, M, BT, BM).to(tl.float32) * _LOG2E
            b_bt = tl.cumsum(b_gt, axis=1)
            b_blv = tl.sum(b_gt, axis=1)
            b_st = _load_rows_t(s, bos, i_t, T, i_h, H, M, BT, BM).to(tl.float32)
            p_v = tl.make_block_ptr(v + (bos * H + i_h) * V, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
            b_v = tl.load(p_v, boundary_check=(0, 1))
            b_sdv = (b_st * tl.exp2(b_blv[:, None] - b_bt)).to(b_v.dtype)
            b_hv = b_hv * tl.exp2(b_blv)[:, None] + _dot(b_sdv, b_v)
        if SEG_PASS:   # the key part stores the segment's decay
            store_segment(b_hv, b_dsum, seg_hv, seg_d, i_nh * NS + i_sg, M, V, 0, i_v * BV, M, BM, BV, True, False)
        elif STORE_HT:
            if i_sg == NS - 1:
                ptv = tl.make_block_ptr(htv + i_nh * M * V, (M, V), (V, 1), (0, i_v * BV), (BM, BV), (1, 0))
                tl.store(ptv, b_hv, boundary_check=(0, 1))


# --------------------------------------------------------------------------------------
# backward: gradients of the slot memories leaving each chunk (reverse scan)
# --------------------------------------------------------------------------------------
@triton.jit
def _bwd_dh_kernel(
    q, g, p, dz, do, dhk, dhv, dhtk, dhtv, dh0k, dh0v, seg_hk, seg_hv, seg_d, cu_seqlens, chunk_offsets,
    scale, T,
    HQ: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, M: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BM: tl.constexpr, NK: tl.constexpr,
    NS, SPLIT: tl.constexpr, USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr, IS_VARLEN: tl.constexpr,
    SEG_PASS: tl.constexpr,
):
    # the reverse of _fwd_h_kernel's scans, segmented the same way (segments carried last to first)
    i_s, i_nhs = tl.program_id(0), tl.program_id(1)
    i_nh, i_sg = i_nhs // NS, i_nhs % NS
    i_n, i_h = i_nh // H, i_nh % H
    G: tl.constexpr = HQ // H
    bos, T, NT, boh = seq_bounds(i_n, T, cu_seqlens, chunk_offsets, BT, IS_VARLEN)
    c_lo, c_hi = segment_of_sequence(i_sg, NT, NS)
    b_dsum = tl.zeros([BM], dtype=tl.float32)
    if i_s < NK:
        i_k = i_s
        b_dh = tl.zeros([BK, BM], dtype=tl.float32)
        if not SEG_PASS:
            if USE_DHT:
                pt = tl.make_block_ptr(dhtk + i_nh * K * M, (K, M), (M, 1), (i_k * BK, 0), (BK, BM), (1, 0))
                b_dh += tl.load(pt, boundary_check=(0, 1)).to(tl.float32)
            if SPLIT:   # the state carried in through the segments before (after) this one; not compiled unsplit
                b_dh = carry_through_segments(b_dh, seg_hk, seg_d, i_nh * NS + NS - 1, NS - 1 - i_sg, -1, K, M,
                                              i_k * BK, 0, M, BK, BM, False)
        for i in range(c_hi - c_lo):
            i_t = c_hi - 1 - i
            if not SEG_PASS:
                p_dh = tl.make_block_ptr(dhk + ((boh + i_t) * H + i_h) * K * M, (K, M), (M, 1),
                                         (i_k * BK, 0), (BK, BM), (1, 0))
                tl.store(p_dh, b_dh.to(p_dh.dtype.element_ty), boundary_check=(0, 1))
            b_b = _gate_cumsum(g, bos, i_t, T, i_h, H, M, BT, BM)
            b_bl = tl.sum(tl.where((tl.arange(0, BT) == BT - 1)[:, None], b_b, 0.), axis=0)
            b_lam = tl.exp2(b_b)
            b_acc = tl.zeros([BK, BM], dtype=tl.float32)
            for i_g in range(G):
                i_hq = i_h * G + i_g
                p_q = tl.make_block_ptr(q + (bos * HQ + i_hq) * K, (K, T), (1, HQ * K), (i_k * BK, i_t * BT),
                                        (BK, BT), (0, 1))
                b_qt = tl.load(p_q, boundary_check=(0, 1))
                b_dz = _load_rows(dz, bos, i_t, T, i_hq, HQ, M, BT, BM)
                b_acc += _dot(b_qt, (b_dz * b_lam).to(b_qt.dtype))
            b_dh = b_dh * tl.exp2(b_bl)[None, :] + b_acc * scale
            b_dsum += b_bl
        if SEG_PASS:
            store_segment(b_dh, b_dsum, seg_hk, seg_d, i_nh * NS + i_sg, K, M, i_k * BK, 0, M, BK, BM, False, True)
        elif STORE_DH0:
            if i_sg == 0:
                p0 = tl.make_block_ptr(dh0k + i_nh * K * M, (K, M), (M, 1), (i_k * BK, 0), (BK, BM), (1, 0))
                tl.store(p0, b_dh, boundary_check=(0, 1))
    else:
        i_v = i_s - NK
        b_dhv = tl.zeros([BM, BV], dtype=tl.float32)
        if not SEG_PASS:
            if USE_DHT:
                ptv = tl.make_block_ptr(dhtv + i_nh * M * V, (M, V), (V, 1), (0, i_v * BV), (BM, BV), (1, 0))
                b_dhv += tl.load(ptv, boundary_check=(0, 1)).to(tl.float32)
            if SPLIT:   # the state carried in through the segments before (after) this one; not compiled unsplit
                b_dhv = carry_through_segments(b_dhv, seg_hv, seg_d, i_nh * NS + NS - 1, NS - 1 - i_sg, -1, M, V,
                                               0, i_v * BV, M, BM, BV, True)
        for i in range(c_hi - c_lo):
            i_t = c_hi - 1 - i
            if not SEG_PASS:
                p_dhv = tl.make_block_ptr(dhv + ((boh + i_t) * H + i_h) * M * V, (M, V), (V, 1),
                                          (0, i_v * BV), (BM, BV), (1, 0))
                tl.store(p_dhv, b_dhv.to(p_dhv.dtype.element_ty), boundary_check=(0, 1))
            b_gt = _load_rows_t(g, bos, i_t, T, i_h, H, M, BT, BM).to(tl.float32) * _LOG2E
            b_bt = tl.cumsum(b_gt, axis=1)
            b_blv = tl.sum(b_gt, axis=1)
            b_lamv = tl.exp2(b_bt)
            b_accv = tl.zeros([BM, BV], dtype=tl.float32)
            for i_g in range(G):
                i_hq = i_h * G + i_g
                b_pt = _load_rows_t(p, bos, i_t, T, i_hq, HQ, M, BT, BM).to(tl.float32)
                p_dov = tl.make_block_ptr(do + (bos * HQ + i_hq) * V, (T, V), (HQ * V, 1), (i_t * BT, i_v * BV),
                                          (BT, BV), (1, 0))
                b_dov = tl.load(p_dov, boundary_check=(0, 1))
                b_accv += _dot((b_pt * b_lamv).to(b_dov.dtype), b_dov)
            b_dhv = b_dhv * tl.exp2(b_blv)[:, None] + b_accv
        if SEG_PASS:   # the key part stores the segment's decay
            store_segment(b_dhv, b_dsum, seg_hv, seg_d, i_nh * NS + i_sg, M, V, 0, i_v * BV, M, BM, BV, True, False)
        elif STORE_DH0:
            if i_sg == 0:
                p0v = tl.make_block_ptr(dh0v + i_nh * M * V, (M, V), (V, 1), (0, i_v * BV), (BM, BV), (1, 0))
                tl.store(p0v, b_dhv, boundary_check=(0, 1))
