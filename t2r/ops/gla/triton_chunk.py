"""Triton chunkwise kernels for GLA (per-key-channel decay) and simple GLA (scalar decay).

Algorithm (GLA paper, section 4, chunk size BT = 64), per kv head and chunk c with the
gate cumsum b inside the chunk (log2 space) and the state h_c entering the chunk:

    o      = scale * [ (q * 2^b) @ h_c  +  tril(A) @ v ],   A_ij = sum_k q_ik k_jk 2^(b_ik - b_jk)
    h_c+1  = 2^b_last * h_c + (k * 2^(b_last - b))^T @ v

Kernels (one launch each):
  fwd:  _fwd_h   states h_c of every chunk (sequential over chunks; long sequences in parallel
                 segments, see triton_utils.segment_of_sequence), final state (fp32)
        _fwd_o   outputs, fully parallel over (V-block, chunk, query head)
  bwd:  _bwd_dh  dh_c = gradient of the state leaving chunk c (reverse, GQA group summed)
        _bwd_dv  dv, per (V-block, chunk, kv head), loops over the query-head group
        _bwd_dqk dq (per query head), dk and dG = sum_g q*dq - k*dk, per (K-block, chunk, kv head)
        reverse_cumsum  dg_t = sum_{s>=t} dG_s + <dh_T, h_T>   (t2r/ops/triton_utils.py)

GQA: states live on kv heads; the query heads of a group are looped over inside the
CTA wherever a result is summed over the group (dh, dv, dk, dg); k/v are never repeated.

Per-channel decay (GLA) inside a chunk: A is built on tensor cores by splitting each decay
factor at an anchor row a: 2^(b_i - b_j) = 2^(b_i - b_a) * 2^(b_a - b_j).
  * One anchor (the chunk's middle row) when the gate cumsum of the chunk spreads over at most
    2^100 (log-gate sum over the 64 steps >= -69 nats, e.g. -1 nat per step): then
        A = (q * 2^(b - b_a)) @ (k * 2^(b_a - b))^T
    is one product, with every factor inside fp32 range. Trained GLA gates (logsigmoid / 16)
    always take this path.
  * Otherwise one anchor per BS-row sub-block s (its middle row), over keys j <= end of s:
        A[rows of s] = (q * 2^(b - b_a)) @ (k * 2^(b_a - b))^T,
    so each factor spans at most BS/2 steps. Exact while no channel decays by more than
    ~87 nats over BS/2 = 8 consecutive steps (mean log-gate >= -10 per step); beyond that the
    factors are clamped (finite, but the diagonal entries lose accuracy).
The choice is made per chunk (and K-block) inside the kernel. Scalar decay (simple GLA) uses
the exact BT x BT decay matrix.

The transposed products that backward needs (A^T, dA^T) are computed as their own dots
from loaded operands instead of tl.trans of an accumulator: Triton 3.6 miscompiles
tl.trans(acc) fed into tl.dot on Hopper at some block sizes (fla issue #640).
"""
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from ..triton_utils import RCP_LN2, next_pow2, num_segments, prepare_chunks, reverse_cumsum, segment_of_sequence

__all__ = ["chunk_gla_triton", "chunk_linear_attn_triton", "CONFIGS"]

BT_DEFAULT = 64
_LOG2E = tl.constexpr(RCP_LN2)
_CLAMP = tl.constexpr(120.0)
# Largest log2 spread of the gate cumsum inside a chunk for which one anchor is used (factors up
# to 2^100 leave 2^28 of fp32 headroom for the dot's sum); past it, the 16-row sub-block path.
_ONE_ANCHOR_SPAN = tl.constexpr(100.0)

# Pinned launch configs: kernel -> (num_warps, num_stages). The benchmark may override
# these to sweep; the GPU tests gradient-check whatever is shipped here.
CONFIGS = {
    "fwd_h": (4, 3),
    "fwd_o": (4, 2),
    "bwd_dh": (4, 3),
    "bwd_dv": (4, 2),
    "bwd_dqk": (8, 1),
}
# Block size along K of the dq/dk kernel for per-channel gates (scalar gates use all of K).
DQK_BK = {"gla": 64}   # 128 spills registers: 5.7 vs 4.0 ms fwd+bwd at the Mistral shape


def _cfg(name):
    w, s = CONFIGS[name]
    return dict(num_warps=w, num_stages=s)


@triton.jit
def _scalar_gate(g, bos, i_h, i_t, T, H: tl.constexpr, BT: tl.constexpr):
    """The [BT] scalar log gates of chunk i_t, in log2 units (plain masked load, no block ptr)."""
    o_t = i_t * BT + tl.arange(0, BT)
    return tl.load(g + (bos + o_t) * H + i_h, mask=o_t < T, other=0.).to(tl.float32) * _LOG2E


@triton.jit
def _one_anchor(b):
    """True when one anchor (the chunk's middle row) keeps every factor 2^(b_i - b_a), 2^(b_a - b_j)
    of this [BT, BK] tile of log2 gate cumsums within 2^+-ONE_ANCHOR_SPAN: then the intra-chunk
    matrix is a single tensor-core product instead of one per sub-block."""
    span = tl.max(tl.max(b, axis=1), axis=0) - tl.min(tl.min(b, axis=1), axis=0)
    return span <= _ONE_ANCHOR_SPAN


@triton.jit
def _anchored(b, BT: tl.constexpr):
    """(2^(b - b_a), 2^(b_a - b)) with a = BT // 2, for the single-anchor path."""
    b_ba = tl.sum(tl.where((tl.arange(0, BT) == BT // 2)[:, None], b, 0.), axis=0)
    return tl.exp2(tl.minimum(b - b_ba[None, :], _CLAMP)), tl.exp2(tl.minimum(b_ba[None, :] - b, _CLAMP))


@triton.jit
def _gated_scores(acc, b_qs, b_k, b_b, BT: tl.constexpr, BS: tl.constexpr, TRANSPOSED: tl.constexpr):
    """acc + this K-block's share of A_ij = sum_k q_ik k_jk 2^(b_ik - b_jk) ([i, j]; [j, i] when
    TRANSPOSED, as its own product: see the note on tl.trans above), for every i and the keys
    j <= i (entries above the diagonal are left for the caller to mask). One anchored product
    when the chunk's gates allow it, else one per BS-row sub-block."""
    dt = b_k.dtype
    if _one_anchor(b_b):
        e_q, e_k = _anchored(b_b, BT)
        b_qa, b_ka = (b_qs * e_q).to(dt), (b_k * e_k).to(dt)
        if TRANSPOSED:
            acc += tl.dot(b_ka, tl.trans(b_qa))
        else:
            acc += tl.dot(b_qa, tl.trans(b_ka))
    else:
        o_i = tl.arange(0, BT)
        for s in tl.static_range(BT // BS):
            b_ba = tl.sum(tl.where((o_i == s * BS + BS // 2)[:, None], b_b, 0.), axis=0)
            m_q = (o_i >= s * BS) & (o_i < s * BS + BS)
            m_k = o_i < s * BS + BS
            b_qa = tl.where(m_q[:, None], b_qs * tl.exp2(tl.minimum(b_b - b_ba[None, :], _CLAMP)), 0.).to(dt)
            b_ka = tl.where(m_k[:, None], b_k * tl.exp2(tl.minimum(b_ba[None, :] - b_b, _CLAMP)), 0.).to(dt)
            if TRANSPOSED:
                acc += tl.dot(b_ka, tl.trans(b_qa))
            else:
                acc += tl.dot(b_qa, tl.trans(b_ka))
    return acc


# --------------------------------------------------------------------------------------
# forward: chunk states
# --------------------------------------------------------------------------------------
@triton.jit
def _fwd_h_kernel(
    k, v, g, h, h0, ht, seg_h, seg_d, cu_seqlens, chunk_offsets, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NS: tl.constexpr,
    SCALAR: tl.constexpr, USE_H0: tl.constexpr, IS_VARLEN: tl.constexpr, SEG_PASS: tl.constexpr,
):
    # one program per (K-block, V-block, sequence x head x segment); NS segments per sequence
    # (triton_utils.segment_of_sequence): SEG_PASS stores each segment's end state from zero and
    # its decay, the other pass the chunk states.
    i_k, i_v, i_nhs = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_nh, i_sg = i_nhs // NS, i_nhs % NS
    i_n, i_h = i_nh // H, i_nh % H
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
    c_lo, c_hi = segment_of_sequence(i_sg, NT, NS)
    o_k = i_k * BK + tl.arange(0, BK)

    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    if not SEG_PASS:
        if USE_H0:
            p_h0 = tl.make_block_ptr(h0 + i_nh * K * V, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
            b_h += tl.load(p_h0, boundary_check=(0, 1)).to(tl.float32)
        if NS > 1:   # carry the state through the other segments (not compiled unsplit)
            for j in range(i_sg):
                i_j = i_nh * NS + j
                p_e = tl.make_block_ptr(seg_h + i_j * K * V, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
                b_d = tl.load(seg_d + i_j * K + o_k, mask=o_k < K, other=0.)
                b_h = b_h * tl.exp2(b_d)[:, None] + tl.load(p_e, boundary_check=(0, 1))
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
        i_j = i_nh * NS + i_sg
        p_e = tl.make_block_ptr(seg_h + i_j * K * V, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
        tl.store(p_e, b_h, boundary_check=(0, 1))
        tl.store(seg_d + i_j * K + o_k, b_dsum, mask=o_k < K)
    elif i_sg == NS - 1:
        p_ht = tl.make_block_ptr(ht + i_nh * K * V, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
        tl.store(p_ht, b_h, boundary_check=(0, 1))


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
    if IS_VARLEN:
        i_n = tl.load(chunk_indices + i_tg * 2)
        i_t = tl.load(chunk_indices + i_tg * 2 + 1)
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
        T = (eos - bos).to(tl.int32)
        i_c = i_tg.to(tl.int64)
    else:
        i_t = i_tg
        bos = (i_b * T).to(tl.int64)
        i_c = (i_b * tl.cdiv(T, BT) + i_t).to(tl.int64)

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
# backward: state gradients (reverse over chunks), summed over the query-head group
# --------------------------------------------------------------------------------------
@triton.jit
def _bwd_dh_kernel(
    q, g, do, dh, dht, dh0, seg_h, seg_d, cu_seqlens, chunk_offsets, scale, T,
    HQ: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NS: tl.constexpr,
    SCALAR: tl.constexpr, USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr, IS_VARLEN: tl.constexpr,
    SEG_PASS: tl.constexpr,
):
    # the reverse of _fwd_h_kernel's scan, segmented the same way (segments carried last to first)
    i_k, i_v, i_nhs = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_nh, i_sg = i_nhs // NS, i_nhs % NS
    i_n, i_h = i_nh // H, i_nh % H
    G: tl.constexpr = HQ // H
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
    c_lo, c_hi = segment_of_sequence(i_sg, NT, NS)
    o_k = i_k * BK + tl.arange(0, BK)

    b_dh = tl.zeros([BK, BV], dtype=tl.float32)
    if not SEG_PASS:
        if USE_DHT:
            p_dht = tl.make_block_ptr(dht + i_nh * K * V, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
            b_dh += tl.load(p_dht, boundary_check=(0, 1)).to(tl.float32)
        if NS > 1:   # carry the state through the other segments (not compiled unsplit)
            for jj in range(NS - 1 - i_sg):
                i_j = i_nh * NS + NS - 1 - jj
                p_e = tl.make_block_ptr(seg_h + i_j * K * V, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
                b_d = tl.load(seg_d + i_j * K + o_k, mask=o_k < K, other=0.)
                b_dh = b_dh * tl.exp2(b_d)[:, None] + tl.load(p_e, boundary_check=(0, 1))
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
            p_q = tl.make_block_ptr(q + (bos * HQ + i_hq) * K, (K, T), (1, HQ * K), (i_k * BK, i_t * BT), (BK, BT), (0, 1))
            p_do = tl.make_block_ptr(do + (bos * HQ + i_hq) * V, (T, V), (HQ * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
            b_q = tl.load(p_q, boundary_check=(0, 1))
            b_do = tl.load(p_do, boundary_check=(0, 1))
            b_dh += tl.dot((b_q * b_e).to(b_q.dtype), b_do)

    if SEG_PASS:
        i_j = i_nh * NS + i_sg
        p_e = tl.make_block_ptr(seg_h + i_j * K * V, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
        tl.store(p_e, b_dh, boundary_check=(0, 1))
        tl.store(seg_d + i_j * K + o_k, b_dsum, mask=o_k < K)
    elif STORE_DH0:
        if i_sg == 0:
            p_dh0 = tl.make_block_ptr(dh0 + i_nh * K * V, (K, V), (V, 1), (i_k * BK, i_v * BV), (BK, BV), (1, 0))
            tl.store(p_dh0, b_dh, boundary_check=(0, 1))


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
    if IS_VARLEN:
        i_n = tl.load(chunk_indices + i_tg * 2)
        i_t = tl.load(chunk_indices + i_tg * 2 + 1)
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
        T = (eos - bos).to(tl.int32)
        i_c = i_tg.to(tl.int64)
    else:
        i_t = i_tg
        bos = (i_b * T).to(tl.int64)
        i_c = (i_b * tl.cdiv(T, BT) + i_t).to(tl.int64)

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
            p_q = tl.make_block_ptr(q + (bos * HQ + i_hq) * K, (T, K), (HQ * K, 1), (i_t * BT, i_k * BK), (BT, BK), (1, 0))
            p_k = tl.make_block_ptr(k + (bos * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, i_k * BK), (BT, BK), (1, 0))
            b_q = tl.load(p_q, boundary_check=(0, 1))
            b_k = tl.load(p_k, boundary_check=(0, 1))
            b_qs = b_q.to(tl.float32) * scale
            if SCALAR:
                b_At += tl.dot(b_k, tl.trans(b_qs.to(b_q.dtype)))
            else:
                p_g = tl.make_block_ptr(g + (bos * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, i_k * BK), (BT, BK), (1, 0))
                b_b = tl.cumsum(tl.load(p_g, boundary_check=(0, 1)).to(tl.float32) * _LOG2E, axis=0)
                b_At = _gated_scores(b_At, b_qs, b_k, b_b, BT, BS, True)
        if SCALAR:
            b_At = tl.where(m_t, b_At * tl.exp2(b_b[None, :] - b_b[:, None]), 0.)
        else:
            b_At = tl.where(m_t, b_At, 0.)
        p_do = tl.make_block_ptr(do + (bos * HQ + i_hq) * V, (T, V), (HQ * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
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
    if IS_VARLEN:
        i_n = tl.load(chunk_indices + i_tg * 2)
        i_t = tl.load(chunk_indices + i_tg * 2 + 1)
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
        T = (eos - bos).to(tl.int32)
        i_c = i_tg.to(tl.int64)
    else:
        i_t = i_tg
        bos = (i_b * T).to(tl.int64)
        i_c = (i_b * tl.cdiv(T, BT) + i_t).to(tl.int64)

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
        one_anchor = _one_anchor(b_b)
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
            p_do = tl.make_block_ptr(do + (bos * HQ + i_hq) * V, (T, V), (HQ * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
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
        p_dq = tl.make_block_ptr(dq + (bos * HQ + i_hq) * K, (T, K), (HQ * K, 1), (i_t * BT, i_k * BK), (BT, BK), (1, 0))
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


# --------------------------------------------------------------------------------------
# host side
# --------------------------------------------------------------------------------------
def _blocks(K: int, V: int):
    BK = min(64, max(16, next_pow2(K)))
    BV = min(64, max(16, next_pow2(V)))
    return BK, BV


def _segment_buffers(n: int, K: int, V: int, device):
    """End states [n, K, V] and total log2 decays [n, K] of the segments of a segmented scan."""
    return (torch.empty(n, K, V, dtype=torch.float32, device=device),
            torch.empty(n, K, dtype=torch.float32, device=device))


def _fwd(q, k, v, g, scale, h0, cu_seqlens, scalar, BT, BS):
    B, T, HQ, K = q.shape
    H, V = v.shape[2], v.shape[3]
    N, NT, chunk_indices, chunk_offsets = prepare_chunks(B, T, BT, cu_seqlens)
    BK, BV = _blocks(K, V)
    h = torch.empty(NT, H, K, V, dtype=k.dtype, device=k.device)
    ht = torch.empty(N, H, K, V, dtype=torch.float32, device=k.device)
    tiles = triton.cdiv(K, BK) * triton.cdiv(V, BV)
    NS = num_segments(tiles * N * H, NT // N, k.device)
    seg_h, seg_d = _segment_buffers(N * H * NS, K, V, k.device) if NS > 1 else (ht, ht)
    for seg_pass in ((True, False) if NS > 1 else (False,)):
        _fwd_h_kernel[(triton.cdiv(K, BK), triton.cdiv(V, BV), N * H * NS)](
            k, v, g, h, h0, ht, seg_h, seg_d, cu_seqlens, chunk_offsets, T,
            H=H, K=K, V=V, BT=BT, BK=BK, BV=BV, NS=NS, SCALAR=scalar, USE_H0=h0 is not None,
            IS_VARLEN=cu_seqlens is not None, SEG_PASS=seg_pass, **_cfg("fwd_h"))
    o = torch.empty(B, T, HQ, V, dtype=v.dtype, device=v.device)
    cap = 128 if q.element_size() == 2 else 64   # fp32 tiles: half the size (shared memory)
    BKo = min(cap, max(16, next_pow2(K)))
    BVo = min(cap, max(16, next_pow2(V)))
    NTg = NT if cu_seqlens is not None else triton.cdiv(T, BT)
    _fwd_o_kernel[(triton.cdiv(V, BVo), NTg, B * HQ)](
        q, k, v, g, h, o, cu_seqlens, chunk_indices, scale, T,
        HQ=HQ, H=H, K=K, V=V, BT=BT, BK=BKo, BV=BVo, BS=BS, SCALAR=scalar,
        IS_VARLEN=cu_seqlens is not None, **_cfg("fwd_o"))
    return o, h, ht


def _bwd(q, k, v, g, h, ht, do, dht, scale, h0, cu_seqlens, scalar, BT, BS):
    B, T, HQ, K = q.shape
    H, V = v.shape[2], v.shape[3]
    N, NT, chunk_indices, chunk_offsets = prepare_chunks(B, T, BT, cu_seqlens)
    varlen = cu_seqlens is not None
    NTg = NT if varlen else triton.cdiv(T, BT)
    BK, BV = _blocks(K, V)
    dh = torch.empty(NT, H, K, V, dtype=k.dtype, device=k.device)
    dh0 = torch.empty(N, H, K, V, dtype=torch.float32, device=k.device) if h0 is not None else None
    tiles = triton.cdiv(K, BK) * triton.cdiv(V, BV)
    NS = num_segments(tiles * N * H, NT // N, k.device)
    seg_h, seg_d = _segment_buffers(N * H * NS, K, V, k.device) if NS > 1 else (dh, dh)
    for seg_pass in ((True, False) if NS > 1 else (False,)):
        _bwd_dh_kernel[(triton.cdiv(K, BK), triton.cdiv(V, BV), N * H * NS)](
            q, g, do, dh, dht, dh0, seg_h, seg_d, cu_seqlens, chunk_offsets, scale, T,
            HQ=HQ, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV, NS=NS, SCALAR=scalar,
            USE_DHT=dht is not None, STORE_DH0=h0 is not None, IS_VARLEN=varlen, SEG_PASS=seg_pass,
            **_cfg("bwd_dh"))

    dv = torch.empty_like(v)
    cap = 128 if q.element_size() == 2 else 64   # fp32 tiles: half the size (shared memory)
    BKv = min(cap, max(16, next_pow2(K)))
    BVv = min(cap, max(16, next_pow2(V)))
    _bwd_dv_kernel[(triton.cdiv(V, BVv), NTg, B * H)](
        q, k, g, do, dh, dv, cu_seqlens, chunk_indices, scale, T,
        HQ=HQ, H=H, K=K, V=V, BT=BT, BK=BKv, BV=BVv, BS=BS, SCALAR=scalar,
        IS_VARLEN=varlen, **_cfg("bwd_dv"))

    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    BKq = min(128 if scalar else min(cap, DQK_BK["gla"]), max(16, next_pow2(K)))
    BVq = min(64 if cap == 128 else 32, max(16, next_pow2(V)))
    NKq = triton.cdiv(K, BKq)
    if scalar:
        assert NKq == 1, "scalar-gate backward supports K <= 128"
        dG = torch.empty(B, T, H, dtype=torch.float32, device=q.device)
    else:
        dG = torch.empty(B, T, H, K, dtype=torch.float32, device=q.device)
    _bwd_dqk_kernel[(NKq, NTg, B * H)](
        q, k, v, g, h, do, dh, dq, dk, dG, cu_seqlens, chunk_indices, scale, T,
        HQ=HQ, H=H, K=K, V=V, BT=BT, BK=BKq, BV=BVq, BS=BS, SCALAR=scalar,
        IS_VARLEN=varlen, **_cfg("bwd_dqk"))

    carry = None
    if dht is not None:
        carry = (dht * ht).sum((-2, -1)) if scalar else (dht * ht).sum(-1)
    dg = reverse_cumsum(dG, g.dtype, carry, cu_seqlens)
    return dq, dk, dv, dg, dh0


class _ChunkLinearAttnFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, scale, initial_state, cu_seqlens, scalar, BT, BS):
        h0 = initial_state.float().contiguous() if initial_state is not None else None
        o, h, ht = _fwd(q, k, v, g, scale, h0, cu_seqlens, scalar, BT, BS)
        ctx.save_for_backward(q, k, v, g, h, ht, h0, cu_seqlens)
        ctx.meta = (scale, scalar, BT, BS, initial_state.dtype if initial_state is not None else None)
        ctx.set_materialize_grads(False)
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, g, h, ht, h0, cu_seqlens = ctx.saved_tensors
        scale, scalar, BT, BS, h0_dtype = ctx.meta
        if do is None:
            do = torch.zeros(q.shape[:3] + (v.shape[-1],), dtype=v.dtype, device=v.device)
        do = do.contiguous()
        if dht is not None:
            dht = dht.float().contiguous()
        dq, dk, dv, dg, dh0 = _bwd(q, k, v, g, h, ht, do, dht, scale, h0, cu_seqlens, scalar, BT, BS)
        if dh0 is not None:
            dh0 = dh0.to(h0_dtype)
        return dq, dk, dv, dg, None, dh0, None, None, None, None


def chunk_linear_attn_triton(q, k, v, g, scale=None, initial_state=None, output_final_state=False,
                             cu_seqlens=None, scalar=False, chunk_size=BT_DEFAULT, sub_block=16):
    """Shared entry of chunk_gla_triton (scalar=False, g [B,T,H,K]) and
    chunk_simple_gla_triton (scalar=True, g [B,T,H])."""
    B, T, HQ, K = q.shape
    H = k.shape[2]
    assert HQ % H == 0, "HQ must be a multiple of H"
    if cu_seqlens is not None:
        assert B == 1, "cu_seqlens needs B == 1"
        cu_seqlens = cu_seqlens.to(torch.int32).contiguous()
    if scale is None:
        scale = K ** -0.5
    q, k, v, g = (t.contiguous() for t in (q, k, v, g))
    o, ht = _ChunkLinearAttnFunction.apply(q, k, v, g, float(scale), initial_state, cu_seqlens,
                                           scalar, chunk_size, sub_block)
    return o, (ht if output_final_state else None)


def chunk_gla_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[torch.Tensor] = None,
    output_final_state: bool = False,
    cu_seqlens: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """GLA with Triton chunkwise kernels (forward and backward).

    q [B,T,HQ,K], k/g [B,T,H,K] (g = log decay <= 0), v [B,T,H,V], initial_state [N,H,K,V];
    returns (o [B,T,HQ,V] in v's dtype, final state [N,H,K,V] fp32 or None).
    Same semantics as ``t2r.ops.gla.naive.naive_recurrent_gla``.
    """
    return chunk_linear_attn_triton(q, k, v, g, scale, initial_state, output_final_state,
                                    cu_seqlens, scalar=False)
