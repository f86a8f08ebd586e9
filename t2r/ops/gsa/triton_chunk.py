"""Triton chunkwise kernels for Gated Slot Attention (forward and backward).

GSA (paper eq. 6-7) is two gated-linear-attention passes joined by a softmax over the M
slots. Per kv head and chunk of BT = 64 steps, with b the cumulative log2 slot decay
inside the chunk (b_i[m] = log2(e) * sum_{s<=i} g_s[m]), Lam = 2^b, and the slot
memories K0 [K, M], V0 [M, V] entering the chunk:

    z  = (q' @ K0) * Lam + mix(tril(q' k^T), s)       q' = scale * q    (slot logits)
    p  = softmax_m(z)
    o  = (p * Lam) @ V0 + tril(A2) @ v,               A2_ij = sum_m p_i[m] s_j[m] 2^(b_i[m]-b_j[m])
    K1 = K0 * 2^b_last + k^T (s * 2^(b_last - b)),    V1 = 2^b_last * V0 + (s * 2^(b_last - b))^T v

with mix(X, s)_i[m] = sum_{j<=i} X_ij s_j[m] 2^(b_i[m]-b_j[m]). The per-slot decay factor
2^(b_i - b_j) is put on tensor cores by splitting it at an anchor row a:
2^(b_i - b_a) * 2^(b_a - b_j).
  * One anchor, the chunk's middle row, when the chunk's gate cumsum spreads over at most
    2^100 (every slot loses <= 69 nats over the chunk's 64 steps): each mix is one product.
    The GSA layer's logsigmoid(x)/8 gates always take this path.
  * Otherwise the middle row of each BS = 16-row block of rows i; for keys j before the
    block the second factor is <= 1, so each factor spans at most BS/2 steps of decay.
    Exact while no slot decays by more than ~70 nats over 8 consecutive steps (mean log
    gate >= -8.5 per step); beyond it the factors are clamped (finite, inaccurate).
The path is chosen per chunk inside the kernels.

Kernels (one launch each):
  fwd: _fwd_h    slot memories entering every chunk (sequential over chunks; long sequences in
                  parallel segments, see triton_utils.segment_of_sequence), final state
       _fwd_o    z (saved, fp32), softmax, o: fully parallel over (query head, chunk)
  bwd: _bwd_dp   per query head: dp (pass-2 read-out gradient), softmax backward dz,
                  row terms z*dz + p*dp of the gate gradient (fp32), and dq
       _bwd_dh    dK~, dV~ leaving every chunk (reverse scan, query-head group summed)
       _bwd_dqk   dk, pass-1 part of ds, gate gradient row terms summed over the group
       _bwd_dvs   dv, pass-2 part of ds, gate gradient per step
       _revcumsum     dg_t = sum_{s>=t} dB_s + <K~_T, dK~_T> + <V~_T, dV~_T>

Gate gradient: with B the global cumulative gate, dL/dB_t[m] = sum_heads (z dz + p dp)_t[m]
- s_t[m] ds_t[m]; dg is its reverse cumsum plus the final-state term.

GQA: states, k, v, s, g live on kv heads. Per-chunk kernels that produce per-query-head
results run one program per query head (adjacent programs share the kv tiles in L2);
everything summed over the group (dh, dk, dv, ds, dg) loops over the group's query
heads inside the program. Nothing is repeated in memory.

Triton 3.6 on Hopper miscompiles tl.trans of an MMA accumulator fed to another dot (fla
issue #640): every transposed product here (A^T, dA^T) is its own dot of loaded or
elementwise operands; only loaded/elementwise tiles are ever transposed.
"""
import os
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from ..triton_utils import (RCP_LN2, is_interpreting, next_pow2, num_segments, prepare_chunks, reverse_cumsum,
                            segment_of_sequence)

__all__ = ["chunk_gsa_triton", "CONFIGS"]

BT = 64
BS = 16
_LOG2E = tl.constexpr(RCP_LN2)
_CLAMP = tl.constexpr(100.0)
# Largest log2 spread of the gate cumsum in a chunk for which one anchor is used (see _block_rows).
_ONE_ANCHOR_SPAN = tl.constexpr(100.0)
# fp32 inputs: tensor-core dots in tf32 (default) or exact fp32 FMA ("ieee").
_PREC = tl.constexpr(os.environ.get("T2R_GSA_FP32_DOT", "tf32"))

# kernel -> (num_warps, num_stages); the benchmark may override, the GPU tests check these.
CONFIGS = {
    "fwd_h": (4, 3),
    "fwd_o": (4, 2),
    "bwd_dp": (4, 2),
    "bwd_dh": (4, 3),
    "bwd_dqk": (8, 1),
    "bwd_dvs": (8, 1),
}


def _cfg(name):
    w, s = CONFIGS[name]
    return dict(num_warps=w, num_stages=s)


# --------------------------------------------------------------------------------------
# shared helpers
# --------------------------------------------------------------------------------------
@triton.jit
def _dot(a, b):
    if a.dtype == tl.float32:
        return tl.dot(a, b, input_precision=_PREC)
    else:
        return tl.dot(a, b)


@triton.jit
def _chunk_bounds(i_tc, i_b, T, cu_seqlens, chunk_indices, BT: tl.constexpr, IS_VARLEN: tl.constexpr):
    """(i_t chunk within its sequence, bos, T of the sequence, global chunk index)."""
    if IS_VARLEN:
        i_n = tl.load(chunk_indices + i_tc * 2)
        i_t = tl.load(chunk_indices + i_tc * 2 + 1)
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
        T = (eos - bos).to(tl.int32)
        i_c = i_tc.to(tl.int64)
    else:
        i_t = i_tc
        bos = (i_b * T).to(tl.int64)
        i_c = (i_b * tl.cdiv(T, BT) + i_t).to(tl.int64)
    return i_t, bos, T, i_c


@triton.jit
def _seq_bounds(i_n, T, cu_seqlens, chunk_offsets, BT: tl.constexpr, IS_VARLEN: tl.constexpr):
    """(bos, T, number of chunks, index of the first chunk) of sequence i_n."""
    if IS_VARLEN:
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
        T = (eos - bos).to(tl.int32)
        NT = tl.cdiv(T, BT)
        boh = tl.load(chunk_offsets + i_n).to(tl.int64)
    else:
        bos = (i_n * T).to(tl.int64)
        NT = tl.cdiv(T, BT)
        boh = (i_n * NT).to(tl.int64)
    return bos, T, NT, boh


@triton.jit
def _load_rows(x, bos, i_t, T, i_h, NH: tl.constexpr, D: tl.constexpr,
               BT: tl.constexpr, BD: tl.constexpr):
    """Rows [i_t*BT, +BT) of head i_h of a [.., T, NH, D] tensor as a [BT, BD] tile (zero padded)."""
    p = tl.make_block_ptr(x + (bos * NH + i_h) * D, (T, D), (NH * D, 1), (i_t * BT, 0), (BT, BD), (1, 0))
    return tl.load(p, boundary_check=(0, 1))


@triton.jit
def _load_rows_t(x, bos, i_t, T, i_h, NH: tl.constexpr, D: tl.constexpr,
                 BT: tl.constexpr, BD: tl.constexpr):
    """The same tile transposed: [BD, BT]."""
    p = tl.make_block_ptr(x + (bos * NH + i_h) * D, (D, T), (1, NH * D), (0, i_t * BT), (BD, BT), (0, 1))
    return tl.load(p, boundary_check=(0, 1))


@triton.jit
def _store_rows(x, val, bos, i_t, T, i_h, NH: tl.constexpr, D: tl.constexpr,
                BT: tl.constexpr, BD: tl.constexpr):
    p = tl.make_block_ptr(x + (bos * NH + i_h) * D, (T, D), (NH * D, 1), (i_t * BT, 0), (BT, BD), (1, 0))
    tl.store(p, val.to(p.dtype.element_ty), boundary_check=(0, 1))


@triton.jit
def _gate_cumsum(g, bos, i_t, T, i_h, H: tl.constexpr, M: tl.constexpr, BT: tl.constexpr, BM: tl.constexpr):
    """b [BT, BM]: log2 cumulative slot decay inside the chunk (padded rows repeat the last)."""
    b_g = _load_rows(g, bos, i_t, T, i_h, H, M, BT, BM).to(tl.float32) * _LOG2E
    return tl.cumsum(b_g, axis=0)


@triton.jit
def _block_rows(b, BT: tl.constexpr, BS: tl.constexpr):
    """Rows per anchor block for this chunk: all BT when a single anchor row keeps every factor
    2^(b_i - b_a), 2^(b_a - b_j) within 2^+-_ONE_ANCHOR_SPAN (each mix below is then one product),
    else BS. Trained GSA gates (logsigmoid / 8) always give BT."""
    span = tl.max(tl.max(b, axis=1), axis=0) - tl.min(tl.min(b, axis=1), axis=0)
    return tl.where(span <= _ONE_ANCHOR_SPAN, BT, BS)


@triton.jit
def _row_anchor(b, I, bs, BT: tl.constexpr):
    """b at the anchor (middle) row of row block I of bs rows: [BM]."""
    o_i = tl.arange(0, BT)
    return tl.sum(tl.where((o_i == I * bs + bs // 2)[:, None], b, 0.), axis=0)


@triton.jit
def _in_block(I, bs, BT: tl.constexpr):
    o_i = tl.arange(0, BT)
    return ((o_i >= I * bs) & (o_i < I * bs + bs))[:, None]


@triton.jit
def _anchor_factor(b, bs, BT: tl.constexpr):
    """F_i = 2^(b_i - b_a(i)) with a(i) the anchor row of i's block: [BT, BM]."""
    b_anc = tl.zeros_like(b)
    for I in range(BT // bs):
        b_anc += tl.where(_in_block(I, bs, BT), _row_anchor(b, I, bs, BT)[None, :], 0.)
    return tl.exp2(tl.minimum(b - b_anc, _CLAMP))


@triton.jit
def _key_factor(b, I, bs, BT: tl.constexpr):
    """H^I_j = 2^(b_a(I) - b_j) for keys j up to the end of row block I, else 0: [BT, BM]."""
    m_k = tl.arange(0, BT) < I * bs + bs
    b_a = _row_anchor(b, I, bs, BT)
    return tl.where(m_k[:, None], tl.exp2(tl.minimum(b_a[None, :] - b, _CLAMP)), 0.)


@triton.jit
def _mix(A, s, b, F, bs, BT: tl.constexpr):
    """mix(X, s) of the module docstring for X = A [BT, BT] (in the dot dtype): [BT, BM] fp32."""
    acc = tl.zeros_like(F)
    for I in range(BT // bs):
        sh = (s * _key_factor(b, I, bs, BT)).to(A.dtype)
        acc += tl.where(_in_block(I, bs, BT), _dot(A, sh), 0.)
    return F * acc


@triton.jit
def _mix_t(X, s, b, like, bs, BT: tl.constexpr):
    """[BT, BT]: entry (i, j) = sum_m X_i[m] s_j[m] 2^(b_i[m] - b_j[m]) for X = Y * F (fp32); the
    lower triangle is the pass-2 matrix A2 (or dA1 in the backward). Dots in like's dtype."""
    acc = tl.zeros([BT, BT], dtype=tl.float32)
    for I in range(BT // bs):
        sh = (s * _key_factor(b, I, bs, BT)).to(like.dtype)
        acc += _dot(tl.where(_in_block(I, bs, BT), X, 0.).to(like.dtype), tl.trans(sh))
    return acc


@triton.jit
def _mix_bwd(X, Y, s, b, bs, BT: tl.constexpr):
    """The two products of the backward kernels for X = Y' * F (fp32), Y [BT, BT] (dot dtype):
    (sum_I (s * H^I) @ X_I^T [BT, BT] (keys j, rows i), sum_I H^I * (Y @ X_I) [BT, BM])."""
    acc = tl.zeros([BT, BT], dtype=tl.float32)
    ds = tl.zeros_like(X)
    for I in range(BT // bs):
        h = _key_factor(b, I, bs, BT)
        x = tl.where(_in_block(I, bs, BT), X, 0.).to(Y.dtype)
        acc += _dot((s * h).to(Y.dtype), tl.trans(x))
        ds += h * _dot(Y, x)
    return acc, ds


@triton.jit
def _softmax_rows(z, M: tl.constexpr, BM: tl.constexpr):
    o_m = tl.arange(0, BM)
    z = tl.where((o_m < M)[None, :], z, float("-inf"))
    e = tl.exp2((z - tl.max(z, axis=1)[:, None]) * _LOG2E)
    return e / tl.sum(e, axis=1)[:, None]


# --------------------------------------------------------------------------------------
# forward: slot memories entering each chunk
# --------------------------------------------------------------------------------------
@triton.jit
def _fwd_h_kernel(
    k, v, s, g, hk, hv, h0k, h0v, htk, htv, seg_hk, seg_hv, seg_d, cu_seqlens, chunk_offsets, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, M: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BM: tl.constexpr, NK: tl.constexpr,
    NS: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr, IS_VARLEN: tl.constexpr,
    SEG_PASS: tl.constexpr,
):
    # programs [0, NK): key-slot memory rows [i*BK, +BK); [NK, NK+NV): value columns; NS segments
    # per sequence (triton_utils.segment_of_sequence): SEG_PASS stores each segment's end state
    # from zero and its slot decay, the other pass the chunk states.
    i_s, i_nhs = tl.program_id(0), tl.program_id(1)
    i_nh, i_sg = i_nhs // NS, i_nhs % NS
    i_n, i_h = i_nh // H, i_nh % H
    bos, T, NT, boh = _seq_bounds(i_n, T, cu_seqlens, chunk_offsets, BT, IS_VARLEN)
    c_lo, c_hi = segment_of_sequence(i_sg, NT, NS)
    o_m = tl.arange(0, BM)
    b_dsum = tl.zeros([BM], dtype=tl.float32)
    if i_s < NK:
        i_k = i_s
        b_h = tl.zeros([BK, BM], dtype=tl.float32)
        if not SEG_PASS:
            if USE_H0:
                p0 = tl.make_block_ptr(h0k + i_nh * K * M, (K, M), (M, 1), (i_k * BK, 0), (BK, BM), (1, 0))
                b_h += tl.load(p0, boundary_check=(0, 1)).to(tl.float32)
            if NS > 1:   # carry the state through the other segments (not compiled unsplit)
                for j in range(i_sg):
                    i_j = i_nh * NS + j
                    p_e = tl.make_block_ptr(seg_hk + i_j * K * M, (K, M), (M, 1), (i_k * BK, 0), (BK, BM), (1, 0))
                    b_d = tl.load(seg_d + i_j * M + o_m, mask=o_m < M, other=0.)
                    b_h = b_h * tl.exp2(b_d)[None, :] + tl.load(p_e, boundary_check=(0, 1))
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
            i_j = i_nh * NS + i_sg
            p_e = tl.make_block_ptr(seg_hk + i_j * K * M, (K, M), (M, 1), (i_k * BK, 0), (BK, BM), (1, 0))
            tl.store(p_e, b_h, boundary_check=(0, 1))
            tl.store(seg_d + i_j * M + o_m, b_dsum, mask=o_m < M)
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
            if NS > 1:   # carry the state through the other segments (not compiled unsplit)
                for j in range(i_sg):
                    i_j = i_nh * NS + j
                    p_e = tl.make_block_ptr(seg_hv + i_j * M * V, (M, V), (V, 1), (0, i_v * BV), (BM, BV), (1, 0))
                    b_d = tl.load(seg_d + i_j * M + o_m, mask=o_m < M, other=0.)
                    b_hv = b_hv * tl.exp2(b_d)[:, None] + tl.load(p_e, boundary_check=(0, 1))
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
        if SEG_PASS:
            i_j = i_nh * NS + i_sg
            p_e = tl.make_block_ptr(seg_hv + i_j * M * V, (M, V), (V, 1), (0, i_v * BV), (BM, BV), (1, 0))
            tl.store(p_e, b_hv, boundary_check=(0, 1))
        elif STORE_HT:
            if i_sg == NS - 1:
                ptv = tl.make_block_ptr(htv + i_nh * M * V, (M, V), (V, 1), (0, i_v * BV), (BM, BV), (1, 0))
                tl.store(ptv, b_hv, boundary_check=(0, 1))


# --------------------------------------------------------------------------------------
# forward: logits, softmax, outputs
# --------------------------------------------------------------------------------------
@triton.jit
def _fwd_o_kernel(
    q, k, v, s, g, hk, hv, o, z, p, cu_seqlens, chunk_indices, scale, T,
    HQ: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, M: tl.constexpr,
    BT: tl.constexpr, BS: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BM: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    i_g, i_tc, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    G: tl.constexpr = HQ // H
    i_b, i_h = i_bh // H, i_bh % H
    i_hq = i_h * G + i_g
    i_t, bos, T, i_c = _chunk_bounds(i_tc, i_b, T, cu_seqlens, chunk_indices, BT, IS_VARLEN)
    o_i = tl.arange(0, BT)
    m_causal = o_i[:, None] >= o_i[None, :]

    b_b = _gate_cumsum(g, bos, i_t, T, i_h, H, M, BT, BM)
    bs = _block_rows(b_b, BT, BS)
    b_F = _anchor_factor(b_b, bs, BT)
    b_s = _load_rows(s, bos, i_t, T, i_h, H, M, BT, BM).to(tl.float32)
    b_q = _load_rows(q, bos, i_t, T, i_hq, HQ, K, BT, BK)
    b_k = _load_rows(k, bos, i_t, T, i_h, H, K, BT, BK)
    dt = b_k.dtype
    b_qs = (b_q.to(tl.float32) * scale).to(dt)
    p_hk = tl.make_block_ptr(hk + (i_c * H + i_h) * K * M, (K, M), (M, 1), (0, 0), (BK, BM), (1, 0))
    b_K0 = tl.load(p_hk, boundary_check=(0, 1)).to(dt)

    # pass 1: slot logits
    b_z = _dot(b_qs, b_K0) * tl.exp2(b_b)
    b_A = tl.where(m_causal, _dot(b_qs, tl.trans(b_k)), 0.).to(dt)
    b_z += _mix(b_A, b_s, b_b, b_F, bs, BT)
    _store_rows(z, b_z, bos, i_t, T, i_hq, HQ, M, BT, BM)
    b_p = _softmax_rows(b_z, M, BM)
    _store_rows(p, b_p, bos, i_t, T, i_hq, HQ, M, BT, BM)

    # pass 2: read the value slots
    p_hv = tl.make_block_ptr(hv + (i_c * H + i_h) * M * V, (M, V), (V, 1), (0, 0), (BM, BV), (1, 0))
    b_V0 = tl.load(p_hv, boundary_check=(0, 1)).to(dt)
    b_o = _dot((b_p * tl.exp2(b_b)).to(dt), b_V0)
    b_A2 = _mix_t(b_p * b_F, b_s, b_b, b_V0, bs, BT)
    b_A2 = tl.where(m_causal, b_A2, 0.)
    b_v = _load_rows(v, bos, i_t, T, i_h, H, V, BT, BV)
    b_o += _dot(b_A2.to(dt), b_v)
    _store_rows(o, b_o, bos, i_t, T, i_hq, HQ, V, BT, BV)


# --------------------------------------------------------------------------------------
# backward: dp (gradient of the slot weights through pass 2), per query head
# --------------------------------------------------------------------------------------
@triton.jit
def _bwd_dp_kernel(
    q, k, v, s, g, hk, hv, z, do, dz, r, dq, cu_seqlens, chunk_indices, scale, T,
    HQ: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, M: tl.constexpr,
    BT: tl.constexpr, BS: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BM: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    i_g, i_tc, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    G: tl.constexpr = HQ // H
    i_b, i_h = i_bh // H, i_bh % H
    i_hq = i_h * G + i_g
    i_t, bos, T, i_c = _chunk_bounds(i_tc, i_b, T, cu_seqlens, chunk_indices, BT, IS_VARLEN)
    o_i = tl.arange(0, BT)
    m_causal = o_i[:, None] >= o_i[None, :]

    b_b = _gate_cumsum(g, bos, i_t, T, i_h, H, M, BT, BM)
    bs = _block_rows(b_b, BT, BS)
    b_F = _anchor_factor(b_b, bs, BT)
    b_s = _load_rows(s, bos, i_t, T, i_h, H, M, BT, BM).to(tl.float32)
    b_v = _load_rows(v, bos, i_t, T, i_h, H, V, BT, BV)
    dt = b_v.dtype
    b_do = _load_rows(do, bos, i_t, T, i_hq, HQ, V, BT, BV).to(dt)
    p_hv = tl.make_block_ptr(hv + (i_c * H + i_h) * M * V, (V, M), (1, V), (0, 0), (BV, BM), (0, 1))
    b_V0t = tl.load(p_hv, boundary_check=(0, 1)).to(dt)
    b_dp = _dot(b_do, b_V0t) * tl.exp2(b_b)
    b_dA = tl.where(m_causal, _dot(b_do, tl.trans(b_v)), 0.).to(dt)
    b_dp += _mix(b_dA, b_s, b_b, b_F, bs, BT)
    b_z = _load_rows(z, bos, i_t, T, i_hq, HQ, M, BT, BM)
    b_p = _softmax_rows(b_z, M, BM)
    b_dz = b_p * (b_dp - tl.sum(b_p * b_dp, axis=1)[:, None])
    _store_rows(dz, b_dz, bos, i_t, T, i_hq, HQ, M, BT, BM)
    _store_rows(r, b_z * b_dz + b_p * b_dp, bos, i_t, T, i_hq, HQ, M, BT, BM)

    # dq = scale * [(dz * Lam) @ K0^T + tril(dA1) @ k],  dA1_ij = sum_m dz_i[m] s_j[m] 2^(b_i[m]-b_j[m])
    b_k = _load_rows(k, bos, i_t, T, i_h, H, K, BT, BK)
    p_hk = tl.make_block_ptr(hk + (i_c * H + i_h) * K * M, (K, M), (M, 1), (0, 0), (BK, BM), (1, 0))
    b_K0 = tl.load(p_hk, boundary_check=(0, 1)).to(dt)
    b_dA1 = _mix_t(b_dz * b_F, b_s, b_b, b_v, bs, BT)
    b_dA1 = tl.where(m_causal, b_dA1, 0.).to(dt)
    b_dq = _dot((b_dz * tl.exp2(b_b)).to(dt), tl.trans(b_K0)) + _dot(b_dA1, b_k)
    _store_rows(dq, b_dq * scale, bos, i_t, T, i_hq, HQ, K, BT, BK)


# --------------------------------------------------------------------------------------
# backward: gradients of the slot memories leaving each chunk (reverse scan)
# --------------------------------------------------------------------------------------
@triton.jit
def _bwd_dh_kernel(
    q, g, p, dz, do, dhk, dhv, dhtk, dhtv, dh0k, dh0v, seg_hk, seg_hv, seg_d, cu_seqlens, chunk_offsets,
    scale, T,
    HQ: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, M: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BM: tl.constexpr, NK: tl.constexpr,
    NS: tl.constexpr, USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr, IS_VARLEN: tl.constexpr,
    SEG_PASS: tl.constexpr,
):
    # the reverse of _fwd_h_kernel's scans, segmented the same way (segments carried last to first)
    i_s, i_nhs = tl.program_id(0), tl.program_id(1)
    i_nh, i_sg = i_nhs // NS, i_nhs % NS
    i_n, i_h = i_nh // H, i_nh % H
    G: tl.constexpr = HQ // H
    bos, T, NT, boh = _seq_bounds(i_n, T, cu_seqlens, chunk_offsets, BT, IS_VARLEN)
    c_lo, c_hi = segment_of_sequence(i_sg, NT, NS)
    o_m = tl.arange(0, BM)
    b_dsum = tl.zeros([BM], dtype=tl.float32)
    if i_s < NK:
        i_k = i_s
        b_dh = tl.zeros([BK, BM], dtype=tl.float32)
        if not SEG_PASS:
            if USE_DHT:
                pt = tl.make_block_ptr(dhtk + i_nh * K * M, (K, M), (M, 1), (i_k * BK, 0), (BK, BM), (1, 0))
                b_dh += tl.load(pt, boundary_check=(0, 1)).to(tl.float32)
            if NS > 1:   # carry the state through the other segments (not compiled unsplit)
                for jj in range(NS - 1 - i_sg):
                    i_j = i_nh * NS + NS - 1 - jj
                    p_e = tl.make_block_ptr(seg_hk + i_j * K * M, (K, M), (M, 1), (i_k * BK, 0), (BK, BM), (1, 0))
                    b_d = tl.load(seg_d + i_j * M + o_m, mask=o_m < M, other=0.)
                    b_dh = b_dh * tl.exp2(b_d)[None, :] + tl.load(p_e, boundary_check=(0, 1))
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
            i_j = i_nh * NS + i_sg
            p_e = tl.make_block_ptr(seg_hk + i_j * K * M, (K, M), (M, 1), (i_k * BK, 0), (BK, BM), (1, 0))
            tl.store(p_e, b_dh, boundary_check=(0, 1))
            tl.store(seg_d + i_j * M + o_m, b_dsum, mask=o_m < M)
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
            if NS > 1:   # carry the state through the other segments (not compiled unsplit)
                for jj in range(NS - 1 - i_sg):
                    i_j = i_nh * NS + NS - 1 - jj
                    p_e = tl.make_block_ptr(seg_hv + i_j * M * V, (M, V), (V, 1), (0, i_v * BV), (BM, BV), (1, 0))
                    b_d = tl.load(seg_d + i_j * M + o_m, mask=o_m < M, other=0.)
                    b_dhv = b_dhv * tl.exp2(b_d)[:, None] + tl.load(p_e, boundary_check=(0, 1))
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
        if SEG_PASS:
            i_j = i_nh * NS + i_sg
            p_e = tl.make_block_ptr(seg_hv + i_j * M * V, (M, V), (V, 1), (0, i_v * BV), (BM, BV), (1, 0))
            tl.store(p_e, b_dhv, boundary_check=(0, 1))
        elif STORE_DH0:
            if i_sg == 0:
                p0v = tl.make_block_ptr(dh0v + i_nh * M * V, (M, V), (V, 1), (0, i_v * BV), (BM, BV), (1, 0))
                tl.store(p0v, b_dhv, boundary_check=(0, 1))


# --------------------------------------------------------------------------------------
# backward: pass 1 (dq, dk, ds part 1, row terms of the gate gradient)
# --------------------------------------------------------------------------------------
@triton.jit
def _bwd_dqk_kernel(
    q, k, s, g, dz, r, dhk, dk, ds1, dB, cu_seqlens, chunk_indices, scale, T,
    HQ: tl.constexpr, H: tl.constexpr, K: tl.constexpr, M: tl.constexpr,
    BT: tl.constexpr, BS: tl.constexpr, BK: tl.constexpr, BM: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    i_tc, i_bh = tl.program_id(0), tl.program_id(1)
    G: tl.constexpr = HQ // H
    i_b, i_h = i_bh // H, i_bh % H
    i_t, bos, T, i_c = _chunk_bounds(i_tc, i_b, T, cu_seqlens, chunk_indices, BT, IS_VARLEN)
    o_i = tl.arange(0, BT)
    m_causal_t = o_i[:, None] <= o_i[None, :]      # [j, i]: j <= i

    b_b = _gate_cumsum(g, bos, i_t, T, i_h, H, M, BT, BM)
    bs = _block_rows(b_b, BT, BS)
    b_F = _anchor_factor(b_b, bs, BT)
    b_s = _load_rows(s, bos, i_t, T, i_h, H, M, BT, BM).to(tl.float32)
    b_k = _load_rows(k, bos, i_t, T, i_h, H, K, BT, BK)
    dt = b_k.dtype

    b_dk = tl.zeros([BT, BK], dtype=tl.float32)
    b_ds = tl.zeros([BT, BM], dtype=tl.float32)
    b_r = tl.zeros([BT, BM], dtype=tl.float32)
    for i_g in range(G):
        i_hq = i_h * G + i_g
        b_q = _load_rows(q, bos, i_t, T, i_hq, HQ, K, BT, BK)
        b_qs = (b_q.to(tl.float32) * scale).to(dt)
        b_dz = _load_rows(dz, bos, i_t, T, i_hq, HQ, M, BT, BM)
        b_r += _load_rows(r, bos, i_t, T, i_hq, HQ, M, BT, BM)
        b_At = tl.where(m_causal_t, _dot(b_k, tl.trans(b_qs)), 0.).to(dt)   # A1^T [j, i]
        b_dAt, b_dsg = _mix_bwd(b_dz * b_F, b_At, b_s, b_b, bs, BT)
        b_ds += b_dsg
        b_dAt = tl.where(m_causal_t, b_dAt, 0.).to(dt)
        b_dk += _dot(b_dAt, b_qs)
    b_bl = tl.sum(tl.where((o_i == BT - 1)[:, None], b_b, 0.), axis=0)
    b_gam = tl.exp2(b_bl[None, :] - b_b)
    p_dh = tl.make_block_ptr(dhk + (i_c * H + i_h) * K * M, (K, M), (M, 1), (0, 0), (BK, BM), (1, 0))
    b_dKn = tl.load(p_dh, boundary_check=(0, 1)).to(dt)
    b_sg = (b_s * b_gam).to(dt)
    b_dk += _dot(b_sg, tl.trans(b_dKn))
    b_ds += b_gam * _dot(b_k, b_dKn)
    _store_rows(dk, b_dk, bos, i_t, T, i_h, H, K, BT, BK)
    _store_rows(ds1, b_ds, bos, i_t, T, i_h, H, M, BT, BM)
    _store_rows(dB, b_r - b_s * b_ds, bos, i_t, T, i_h, H, M, BT, BM)


# --------------------------------------------------------------------------------------
# backward: pass 2 (dv, ds, per-step gate gradient)
# --------------------------------------------------------------------------------------
@triton.jit
def _bwd_dvs_kernel(
    v, s, g, p, do, dhv, dv, ds1, ds, dB, cu_seqlens, chunk_indices, T,
    HQ: tl.constexpr, H: tl.constexpr, V: tl.constexpr, M: tl.constexpr,
    BT: tl.constexpr, BS: tl.constexpr, BV: tl.constexpr, BM: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    i_tc, i_bh = tl.program_id(0), tl.program_id(1)
    G: tl.constexpr = HQ // H
    i_b, i_h = i_bh // H, i_bh % H
    i_t, bos, T, i_c = _chunk_bounds(i_tc, i_b, T, cu_seqlens, chunk_indices, BT, IS_VARLEN)
    o_i = tl.arange(0, BT)
    m_causal_t = o_i[:, None] <= o_i[None, :]

    b_b = _gate_cumsum(g, bos, i_t, T, i_h, H, M, BT, BM)
    b_bl = tl.sum(tl.where((o_i == BT - 1)[:, None], b_b, 0.), axis=0)
    b_gam = tl.exp2(b_bl[None, :] - b_b)
    bs = _block_rows(b_b, BT, BS)
    b_F = _anchor_factor(b_b, bs, BT)
    b_s = _load_rows(s, bos, i_t, T, i_h, H, M, BT, BM).to(tl.float32)
    b_v = _load_rows(v, bos, i_t, T, i_h, H, V, BT, BV)
    dt = b_v.dtype
    p_dh = tl.make_block_ptr(dhv + (i_c * H + i_h) * M * V, (M, V), (V, 1), (0, 0), (BM, BV), (1, 0))
    b_dVn = tl.load(p_dh, boundary_check=(0, 1)).to(dt)

    b_dv = tl.zeros([BT, BV], dtype=tl.float32)
    b_ds = tl.zeros([BT, BM], dtype=tl.float32)
    for i_g in range(G):
        i_hq = i_h * G + i_g
        b_do = _load_rows(do, bos, i_t, T, i_hq, HQ, V, BT, BV).to(dt)
        b_pF = _load_rows(p, bos, i_t, T, i_hq, HQ, M, BT, BM).to(tl.float32) * b_F
        b_dAt = tl.where(m_causal_t, _dot(b_v, tl.trans(b_do)), 0.).to(dt)   # dA2^T [j, i]
        b_At, b_dsg = _mix_bwd(b_pF, b_dAt, b_s, b_b, bs, BT)
        b_ds += b_dsg
        b_At = tl.where(m_causal_t, b_At, 0.).to(dt)
        b_dv += _dot(b_At, b_do)
    b_sg = (b_s * b_gam).to(dt)
    b_dv += _dot(b_sg, b_dVn)
    b_ds += b_gam * _dot(b_v, tl.trans(b_dVn))
    _store_rows(dv, b_dv, bos, i_t, T, i_h, H, V, BT, BV)
    b_ds1 = _load_rows(ds1, bos, i_t, T, i_h, H, M, BT, BM)
    b_dB = _load_rows(dB, bos, i_t, T, i_h, H, M, BT, BM)
    _store_rows(ds, b_ds1 + b_ds, bos, i_t, T, i_h, H, M, BT, BM)
    _store_rows(dB, b_dB - b_s * b_ds, bos, i_t, T, i_h, H, M, BT, BM)


# --------------------------------------------------------------------------------------
# host side
# --------------------------------------------------------------------------------------
def _tile(D: int) -> int:
    """Full tile along K, V or M. On the GPU at least 64: with 16-wide tiles the Triton 3.6
    Hopper build of the backward kernels hit illegal memory accesses (seen at K=16, V=32,
    M=16); only 64- and 128-wide tiles were checked on the H100."""
    return next_pow2(D) if is_interpreting() else max(64, next_pow2(D))


def _split(D: int) -> int:
    """Block of the state scans along K or V (several programs per head for parallelism)."""
    return min(64, next_pow2(D)) if is_interpreting() else 64


def _segment_buffers(n: int, K: int, V: int, M: int, device):
    """End states of the key and value memories ([n, K, M], [n, M, V]) and the total log2 slot
    decays [n, M] of the segments of a segmented scan."""
    f32 = dict(dtype=torch.float32, device=device)
    return torch.empty(n, K, M, **f32), torch.empty(n, M, V, **f32), torch.empty(n, M, **f32)


def _fwd(q, k, v, s, g, scale, h0k, h0v, output_final_state, cu_seqlens):
    B, T, HQ, K = q.shape
    H, V, M = k.shape[2], v.shape[3], s.shape[3]
    G = HQ // H
    N, NTT, chunk_indices, chunk_offsets = prepare_chunks(B, T, BT, cu_seqlens)
    BKf, BVf, BM = _tile(K), _tile(V), _tile(M)
    BKs, BVs = _split(K), _split(V)
    NK, NV = triton.cdiv(K, BKs), triton.cdiv(V, BVs)
    sdt = q.dtype
    hk = q.new_empty(NTT, H, K, M, dtype=sdt)
    hv = q.new_empty(NTT, H, M, V, dtype=sdt)
    htk = q.new_empty(N, H, K, M, dtype=torch.float32) if output_final_state else None
    htv = q.new_empty(N, H, M, V, dtype=torch.float32) if output_final_state else None
    use_h0 = h0k is not None
    NS = num_segments((NK + NV) * N * H, NTT // N, q.device)
    seg = _segment_buffers(N * H * NS, K, V, M, q.device) if NS > 1 else (hk, hv, hk)
    for seg_pass in ((True, False) if NS > 1 else (False,)):
        _fwd_h_kernel[(NK + NV, N * H * NS)](
            k, v, s, g, hk, hv, h0k if use_h0 else hk, h0v if use_h0 else hv,
            htk if output_final_state else hk, htv if output_final_state else hv, *seg,
            cu_seqlens, chunk_offsets, T,
            H=H, K=K, V=V, M=M, BT=BT, BK=BKs, BV=BVs, BM=BM, NK=NK, NS=NS,
            USE_H0=use_h0, STORE_HT=output_final_state, IS_VARLEN=cu_seqlens is not None, SEG_PASS=seg_pass,
            **_cfg("fwd_h"))
    o = torch.empty(B, T, HQ, V, dtype=v.dtype, device=q.device)
    z = torch.empty(B, T, HQ, M, dtype=torch.float32, device=q.device)
    p = torch.empty(B, T, HQ, M, dtype=q.dtype, device=q.device)
    NTg = NTT if cu_seqlens is not None else triton.cdiv(T, BT)
    Bg = 1 if cu_seqlens is not None else B
    _fwd_o_kernel[(G, NTg, Bg * H)](
        q, k, v, s, g, hk, hv, o, z, p, cu_seqlens, chunk_indices, scale, T,
        HQ=HQ, H=H, K=K, V=V, M=M, BT=BT, BS=BS, BK=BKf, BV=BVf, BM=BM,
        IS_VARLEN=cu_seqlens is not None, **_cfg("fwd_o"))
    return o, z, p, hk, hv, htk, htv, (N, NTT, chunk_indices, chunk_offsets)


def _bwd(q, k, v, s, g, scale, z, p, hk, hv, do, dhtk, dhtv, htk, htv, need_dh0, cu_seqlens, chunks):
    B, T, HQ, K = q.shape
    H, V, M = k.shape[2], v.shape[3], s.shape[3]
    G = HQ // H
    N, NTT, chunk_indices, chunk_offsets = chunks
    BKf, BVf, BM = _tile(K), _tile(V), _tile(M)
    BKs, BVs = _split(K), _split(V)
    NK, NV = triton.cdiv(K, BKs), triton.cdiv(V, BVs)
    varlen = cu_seqlens is not None
    NTg = NTT if varlen else triton.cdiv(T, BT)
    Bg = 1 if varlen else B
    do = do.contiguous()

    dz = torch.empty(z.shape, dtype=q.dtype, device=q.device)   # only ever a dot operand (after scaling)
    r = torch.empty_like(z)
    dq = torch.empty_like(q)
    _bwd_dp_kernel[(G, NTg, Bg * H)](
        q, k, v, s, g, hk, hv, z, do, dz, r, dq, cu_seqlens, chunk_indices, scale, T,
        HQ=HQ, H=H, K=K, V=V, M=M, BT=BT, BS=BS, BK=BKf, BV=BVf, BM=BM, IS_VARLEN=varlen, **_cfg("bwd_dp"))

    sdt = q.dtype
    dhk = q.new_empty(NTT, H, K, M, dtype=sdt)
    dhv = q.new_empty(NTT, H, M, V, dtype=sdt)
    use_dht = dhtk is not None
    dh0k = q.new_empty(N, H, K, M, dtype=torch.float32) if need_dh0 else None
    dh0v = q.new_empty(N, H, M, V, dtype=torch.float32) if need_dh0 else None
    NS = num_segments((NK + NV) * N * H, NTT // N, q.device)
    seg = _segment_buffers(N * H * NS, K, V, M, q.device) if NS > 1 else (dhk, dhv, dhk)
    for seg_pass in ((True, False) if NS > 1 else (False,)):
        _bwd_dh_kernel[(NK + NV, N * H * NS)](
            q, g, p, dz, do, dhk, dhv, dhtk if use_dht else dhk, dhtv if use_dht else dhv,
            dh0k if need_dh0 else dhk, dh0v if need_dh0 else dhv, *seg, cu_seqlens, chunk_offsets, scale, T,
            HQ=HQ, H=H, K=K, V=V, M=M, BT=BT, BK=BKs, BV=BVs, BM=BM, NK=NK, NS=NS,
            USE_DHT=use_dht, STORE_DH0=need_dh0, IS_VARLEN=varlen, SEG_PASS=seg_pass, **_cfg("bwd_dh"))

    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    ds = torch.empty_like(s)
    ds1 = torch.empty(s.shape, dtype=torch.float32, device=s.device)
    dB = torch.empty(s.shape, dtype=torch.float32, device=s.device)
    _bwd_dqk_kernel[(NTg, Bg * H)](
        q, k, s, g, dz, r, dhk, dk, ds1, dB, cu_seqlens, chunk_indices, scale, T,
        HQ=HQ, H=H, K=K, M=M, BT=BT, BS=BS, BK=BKf, BM=BM, IS_VARLEN=varlen, **_cfg("bwd_dqk"))
    _bwd_dvs_kernel[(NTg, Bg * H)](
        v, s, g, p, do, dhv, dv, ds1, ds, dB, cu_seqlens, chunk_indices, T,
        HQ=HQ, H=H, V=V, M=M, BT=BT, BS=BS, BV=BVf, BM=BM, IS_VARLEN=varlen, **_cfg("bwd_dvs"))

    carry = None
    if use_dht:
        carry = (htk * dhtk.float()).sum(2) + (htv * dhtv.float()).sum(3)      # [N, H, M]
    dg = reverse_cumsum(dB, g.dtype, carry, cu_seqlens,
                        block_d=min(16, next_pow2(dB.shape[-1])), num_warps=2, num_stages=3)
    return dq, dk, dv, ds, dg, dh0k, dh0v


class ChunkGSAFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, s, g, scale, h0k, h0v, output_final_state, cu_seqlens):
        q, k, v, s, g = (t.contiguous() for t in (q, k, v, s, g))
        if h0k is not None:
            h0k, h0v = h0k.contiguous(), h0v.contiguous()
        # the final state is always computed: it feeds the gate gradient's carry term
        o, z, p, hk, hv, htk, htv, chunks = _fwd(q, k, v, s, g, scale, h0k, h0v, True, cu_seqlens)
        ctx.save_for_backward(q, k, v, s, g, z, p, hk, hv, htk, htv, h0k, cu_seqlens,
                              *(t for t in chunks[2:] if t is not None))
        ctx.scale, ctx.chunks_n = scale, chunks[:2]
        ctx.has_h0 = h0k is not None
        ctx.h0_dtypes = (h0k.dtype, h0v.dtype) if h0k is not None else None
        if output_final_state:
            return o, htk, htv
        return o, None, None

    @staticmethod
    def backward(ctx, do, dhtk, dhtv):
        q, k, v, s, g, z, p, hk, hv, htk, htv, h0k, cu_seqlens, *tables = ctx.saved_tensors
        chunk_indices, chunk_offsets = (tables if tables else (None, None))
        chunks = (*ctx.chunks_n, chunk_indices, chunk_offsets)
        if dhtk is None and dhtv is not None:
            dhtk = torch.zeros_like(htk)
        if dhtv is None and dhtk is not None:
            dhtv = torch.zeros_like(htv)
        if dhtk is not None:
            dhtk, dhtv = dhtk.contiguous(), dhtv.contiguous()
        dq, dk, dv, ds, dg, dh0k, dh0v = _bwd(
            q, k, v, s, g, ctx.scale, z, p, hk, hv, do, dhtk, dhtv, htk, htv, ctx.has_h0, cu_seqlens, chunks)
        if ctx.has_h0:
            dh0k, dh0v = dh0k.to(ctx.h0_dtypes[0]), dh0v.to(ctx.h0_dtypes[1])
        return dq, dk, dv, ds, dg, None, dh0k, dh0v, None, None


def chunk_gsa_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    s: torch.Tensor,
    g: torch.Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
    output_final_state: bool = False,
    cu_seqlens: Optional[torch.LongTensor] = None,
) -> Tuple[torch.Tensor, Optional[Tuple[torch.Tensor, torch.Tensor]]]:
    """Chunkwise GSA on Triton (forward and backward); same contract as `t2r.ops.gsa`."""
    K = q.shape[-1]
    scale = K ** -0.5 if scale is None else float(scale)
    h0k, h0v = (None, None) if initial_state is None else tuple(initial_state)
    if cu_seqlens is not None:
        cu_seqlens = cu_seqlens.to(device=q.device, dtype=torch.int32).contiguous()
    o, htk, htv = ChunkGSAFunction.apply(q, k, v, s, g, scale, h0k, h0v, output_final_state, cu_seqlens)
    return o, ((htk, htv) if output_final_state else None)
