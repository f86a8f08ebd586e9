"""Forgetting attention in Triton: a FlashAttention-2 style forward and backward.

Semantics (those of ``t2r.ops.fox.naive.naive_forgetting_attention``)::

    c_j      = sum_{t <= j} g_t                       (fp32 cumulative log forget gate)
    s_ij     = scale * q_i . k_j + c_{p_i} - c_j       p_i = Tk - Tq + i (bottom-right causal)
    o_i      = sum_{j <= p_i} softmax_j(s_ij) v_j

Shapes: q ``[B, Tq, HQ, K]``, k ``[B, Tk, H, K]``, v ``[B, Tk, H, V]``, g ``[B, Tk, HQ]``
(log forget gates, <= 0, one per query head).  GQA: query head ``i`` reads kv head
``i // (HQ // H)``; k and v are never repeated in memory.

Kernels (all work in log2 units: ``c2 = c * log2(e)``, ``exp2`` everywhere):

* ``_fwd_kernel``: one program per (query block, batch*query head), heaviest
  blocks first.  Key blocks below the diagonal run without masks, the diagonal
  blocks with the causal mask.  Writes ``o`` and the row log-sum-exp (log2).
* ``_delta_kernel``: ``delta_i = do_i . o_i`` (fp32).
* ``_bwd_dkv_kernel``: one program per (key block, batch*kv head).  It loops over
  the ``G = HQ // H`` query heads of the group and accumulates dk and dv for all
  of them in registers (fp32), so no per-query-head buffers exist.  It also
  writes ``dc_j = -sum_i dS_ij`` per query head (the gradient of the key-side
  bias), which is free there: a reduction of the ``dS^T`` tile along its rows.
* ``_bwd_dq_kernel``: one program per (query block, batch*query head).

Gradient of the gates.  With ``dS_ij = P_ij (dP_ij - delta_i)`` the gradient of
the logits, ``dL/dc_m = sum_i [p_i = m] sum_j dS_ij - sum_i dS_im``: a row sum
(written by the dq kernel, ``dcq``) minus a column sum (written by the dkv kernel,
``dc``).  In exact arithmetic the row sum is zero (a softmax row does not change
when one constant, here ``c_{p_i}``, is added to all its logits), but ``delta``
is computed from ``o`` rounded to bf16, and keeping the computed row sum cancels
that rounding exactly: dg then only sums ``dS`` over pairs (i, j) with
``j < t <= p_i``.  Dropping it made dg 10x less accurate in bf16 (3.5e-2 vs
~5e-3 relative on an H100).  Since ``c_m = sum_{t <= m} g_t``,
``dg_t = sum_{m >= t} dL/dc_m``: a reverse cumulative sum (PyTorch, fp32).  For
packed documents (``cu_seqlens``) the global reverse cumsum is still right: the
``dL/dc`` of one document sums to zero, so later documents add nothing to
earlier ones.

Padding: ``attention_mask`` ``[B, Tk]`` (0 = padded key) is folded into a
key-side bias ``c_k = c + inf * (1 - mask)``; rows with no key output 0 (their
log-sum-exp is stored as +inf so the backward gives them zero gradient).

Packed documents: ``cu_seqlens`` ``[N+1]`` with ``B == 1`` and ``Tq == Tk``.  No
host synchronisation: each position carries its document's start and end.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

LOG2E = 1.4426950408889634

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


# --------------------------------------------------------------------------------------
# configs: small and pinned, no autotuning.  Key: head dim (max of K and V), <= 128.
# fwd / dkv / dq: (BM, BN, num_warps, num_stages).  Chosen on an H100 with
# `python benchmarks/bench_fox.py --sweep` (benchmarks/results/fox_h100.md); each was
# gradient-checked there.  "fuse_dq": 1 or 2 makes the dkv kernel also add dq into an
# fp32 buffer (1: atomics, 2: TMA reduce-add) and skips the dq kernel; it is correct but
# spills registers and measured 8.1 ms vs 4.4 ms for the backward at B4 T4K HQ32 D128, so
# it is off.
# --------------------------------------------------------------------------------------
_CONFIGS = {
    64: dict(fwd=(128, 64, 4, 3), dkv=(32, 128, 4, 3), dq=(64, 64, 4, 3)),
    128: dict(fwd=(128, 128, 8, 3), dkv=(64, 128, 8, 2), dq=(128, 128, 8, 2)),
}
_INTERPRET_CONFIG = dict(fwd=(32, 16, 4, 1), dkv=(16, 32, 4, 1), dq=(32, 16, 4, 1))

# Set by tests and the benchmark to force a config; None = the table above.
CONFIG_OVERRIDE: dict | None = None
# The last compiled kernel of each kind (for the benchmark's register / spill report).
LAST_KERNEL: dict = {}


def _config(d: int) -> dict:
    if CONFIG_OVERRIDE is not None:
        return CONFIG_OVERRIDE
    if _INTERPRET:
        return _INTERPRET_CONFIG
    for key in sorted(_CONFIGS):
        if d <= key:
            return _CONFIGS[key]
    raise ValueError(f"head dim {d} is not supported")


# --------------------------------------------------------------------------------------
# forward
# --------------------------------------------------------------------------------------
@triton.jit
def _fwd_inner(
    acc, l_i, m_i, q, cq, sq, pq,
    k_base, v_base, ck_base, stride_kt, stride_vt,
    lo, hi, Tk, qk_scale,
    DK: tl.constexpr, DV: tl.constexpr, BN: tl.constexpr,
    MASKED: tl.constexpr, VARLEN: tl.constexpr,
):
    offs_dk = tl.arange(0, DK)
    offs_dv = tl.arange(0, DV)
    for start_n in range(lo, hi, BN):
        offs_n = start_n + tl.arange(0, BN)
        if MASKED:
            nmask = offs_n < Tk
            kT = tl.load(k_base + offs_n[None, :] * stride_kt + offs_dk[:, None], mask=nmask[None, :], other=0.0)
            ck = tl.load(ck_base + offs_n, mask=nmask, other=0.0)
        else:
            kT = tl.load(k_base + offs_n[None, :] * stride_kt + offs_dk[:, None])
            ck = tl.load(ck_base + offs_n)
        s = tl.dot(q, kT) * qk_scale + (cq[:, None] - ck[None, :])
        if MASKED:
            keep = offs_n[None, :] <= pq[:, None]
            if VARLEN:
                keep = keep & (offs_n[None, :] >= sq[:, None])
            s = tl.where(keep, s, float("-inf"))
        elif VARLEN:
            s = tl.where(offs_n[None, :] >= sq[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # rows with no visible key so far keep m = -inf; anchor them at 0 to avoid inf - inf
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_use[:, None])
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        if MASKED:
            v = tl.load(v_base + offs_n[:, None] * stride_vt + offs_dv[None, :], mask=nmask[:, None], other=0.0)
        else:
            v = tl.load(v_base + offs_n[:, None] * stride_vt + offs_dv[None, :])
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _fwd_kernel(
    Q, K, V, CQ, CK, O, ROWB, SEG_START,
    stride_qb, stride_qt, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_ob, stride_ot, stride_oh,
    Tq, Tk, HQ, G, qk_scale,
    DK: tl.constexpr, DV: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
    VARLEN: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    start_m = (tl.num_programs(0) - 1 - pid_m) * BM  # heaviest blocks first
    b = pid_bh // HQ
    hq = pid_bh % HQ
    h = hq // G
    off = Tk - Tq

    offs_m = start_m + tl.arange(0, BM)
    mmask = offs_m < Tq
    offs_dk = tl.arange(0, DK)
    offs_dv = tl.arange(0, DV)
    b64 = b.to(tl.int64)

    q_base = Q + b64 * stride_qb + hq * stride_qh
    q = tl.load(q_base + offs_m[:, None] * stride_qt + offs_dk[None, :], mask=mmask[:, None], other=0.0)
    k_base = K + b64 * stride_kb + h * stride_kh
    v_base = V + b64 * stride_vb + h * stride_vh
    crow = (b64 * HQ + hq) * Tk
    pq = offs_m + off
    cq = tl.load(CQ + crow + pq, mask=mmask, other=0.0)

    if VARLEN:
        sq = tl.load(SEG_START + offs_m, mask=mmask, other=0)
        lo = (tl.load(SEG_START + start_m) // BN) * BN
    else:
        sq = offs_m  # unused
        lo = 0
    full_hi = ((start_m + off + 1) // BN) * BN
    hi = tl.minimum(start_m + BM + off, Tk)

    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, DV], tl.float32)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, cq, sq, pq, k_base, v_base, CK + crow,
                               stride_kt, stride_vt, lo, full_hi, Tk, qk_scale,
                               DK, DV, BN, False, VARLEN)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, cq, sq, pq, k_base, v_base, CK + crow,
                               stride_kt, stride_vt, full_hi, hi, Tk, qk_scale,
                               DK, DV, BN, True, VARLEN)
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    o = acc / l_safe[:, None]
    m_use = tl.where(m_i == float("-inf"), 0.0, m_i)
    # the backward needs exp2(s - lse) = exp2(qk * scale + (cq - lse) - ck): store cq - lse
    rowb = tl.where(empty, float("-inf"), cq - (m_use + tl.math.log2(l_safe)))
    o_base = O + b64 * stride_ob + hq * stride_oh
    tl.store(o_base + offs_m[:, None] * stride_ot + offs_dv[None, :], o.to(O.dtype.element_ty), mask=mmask[:, None])
    tl.store(ROWB + (b64 * HQ + hq) * Tq + offs_m, rowb, mask=mmask)


# --------------------------------------------------------------------------------------
# backward
# --------------------------------------------------------------------------------------
@triton.jit
def _delta_kernel(
    O, DO, DELTA, stride_ob, stride_ot, stride_oh, stride_dob, stride_dot, stride_doh,
    Tq, HQ, DV: tl.constexpr, BM: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // HQ).to(tl.int64)
    hq = pid_bh % HQ
    offs_m = pid_m * BM + tl.arange(0, BM)
    mmask = offs_m < Tq
    offs_dv = tl.arange(0, DV)
    o = tl.load(O + b * stride_ob + hq * stride_oh + offs_m[:, None] * stride_ot + offs_dv[None, :],
                mask=mmask[:, None], other=0.0).to(tl.float32)
    do = tl.load(DO + b * stride_dob + hq * stride_doh + offs_m[:, None] * stride_dot + offs_dv[None, :],
                 mask=mmask[:, None], other=0.0).to(tl.float32)
    tl.store(DELTA + (b * HQ + hq) * Tq + offs_m, tl.sum(o * do, 1), mask=mmask)


@triton.jit
def _bwd_dkv_inner(
    dk, dv, dck, k, v, ck, kpos,
    q_base, do_base, rowb_base, delta_base, SEG_START,
    stride_qt, stride_dot, lo, hi, Tq, qk_scale,
    dq_desc, dq_base, stride_dqt, dcq_base, b, hq, scale,
    DK: tl.constexpr, DV: tl.constexpr, BM: tl.constexpr,
    MASKED: tl.constexpr, VARLEN: tl.constexpr, FUSE_DQ: tl.constexpr,
):
    offs_dk = tl.arange(0, DK)
    offs_dv = tl.arange(0, DV)
    for start_m in range(lo, hi, BM):
        offs_m = start_m + tl.arange(0, BM)
        mmask = offs_m < Tq
        qT = tl.load(q_base + offs_m[None, :] * stride_qt + offs_dk[:, None], mask=mmask[None, :], other=0.0)
        # rows past Tq get a bias of -inf, so their probabilities are exactly 0
        rowb = tl.load(rowb_base + offs_m, mask=mmask, other=float("-inf"))
        sT = tl.dot(k, qT) * qk_scale + (rowb[None, :] - ck[:, None])
        if MASKED:
            keep = offs_m[None, :] >= kpos[:, None]
            if VARLEN:
                sm = tl.load(SEG_START + offs_m, mask=mmask, other=0)
                keep = keep & (sm[None, :] <= kpos[:, None])
            sT = tl.where(keep, sT, float("-inf"))
        elif VARLEN:
            sm = tl.load(SEG_START + offs_m, mask=mmask, other=0)
            sT = tl.where(sm[None, :] <= kpos[:, None], sT, float("-inf"))
        pT = tl.math.exp2(sT)
        do = tl.load(do_base + offs_m[:, None] * stride_dot + offs_dv[None, :], mask=mmask[:, None], other=0.0)
        dv = tl.dot(pT.to(do.dtype), do, dv)
        delta = tl.load(delta_base + offs_m, mask=mmask, other=0.0)
        dpT = tl.dot(v, tl.trans(do))
        dsT = pT * (dpT - delta[None, :])
        dck += tl.sum(dsT, 1)
        dsT_lp = dsT.to(qT.dtype)
        dk = tl.dot(dsT_lp, tl.trans(qT), dk)
        if FUSE_DQ > 0:
            # dq rows of this block, added into an fp32 buffer: 1 = atomics, 2 = TMA reduce-add
            dq_part = tl.dot(tl.trans(dsT_lp), k) * scale
            if FUSE_DQ == 2:
                dq_desc.atomic_add([b, start_m, hq, 0], dq_part.reshape(1, BM, 1, DK))
            else:
                tl.atomic_add(dq_base + offs_m[:, None] * stride_dqt + offs_dk[None, :], dq_part,
                              mask=mmask[:, None], sem="relaxed")
            tl.atomic_add(dcq_base + offs_m, tl.sum(dsT, 0), mask=mmask, sem="relaxed")
    return dk, dv, dck


@triton.jit
def _bwd_dkv_kernel(
    Q, K, V, DO, CK, ROWB, DELTA, DK, DV, DC, SEG_START, SEG_END, dq_desc, DQ32, DCQ,
    stride_qb, stride_qt, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_dob, stride_dot, stride_doh,
    stride_dkb, stride_dkt, stride_dkh,
    stride_dvb, stride_dvt, stride_dvh,
    stride_dqb, stride_dqt, stride_dqh,
    Tq, Tk, HQ, H, G, qk_scale, scale,
    DK_: tl.constexpr, DV_: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
    VARLEN: tl.constexpr, FUSE_DQ: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    b64 = b.to(tl.int64)
    off = Tk - Tq
    start_n = pid_n * BN
    offs_n = start_n + tl.arange(0, BN)
    nmask = offs_n < Tk
    offs_dk = tl.arange(0, DK_)
    offs_dv = tl.arange(0, DV_)

    k = tl.load(K + b64 * stride_kb + h * stride_kh + offs_n[:, None] * stride_kt + offs_dk[None, :],
                mask=nmask[:, None], other=0.0)
    v = tl.load(V + b64 * stride_vb + h * stride_vh + offs_n[:, None] * stride_vt + offs_dv[None, :],
                mask=nmask[:, None], other=0.0)

    # rows [row_lo, row_full) may see a masked entry of this key block; rows >= row_full see all of it
    row_lo = (tl.maximum(start_n - off, 0) // BM) * BM
    row_full = tl.cdiv(tl.maximum(start_n + BN - 1 - off, 0), BM) * BM
    if VARLEN:
        row_hi = tl.load(SEG_END + tl.minimum(start_n + BN, Tk) - 1)
    else:
        row_hi = Tq
    row_mid = tl.minimum(row_full, row_hi)

    dk = tl.zeros([BN, DK_], tl.float32)
    dv = tl.zeros([BN, DV_], tl.float32)
    for gi in range(G):
        hq = h * G + gi
        crow = (b64 * HQ + hq) * Tk
        ck = tl.load(CK + crow + offs_n, mask=nmask, other=float("inf"))  # keys past Tk: p = 0
        q_base = Q + b64 * stride_qb + hq * stride_qh
        do_base = DO + b64 * stride_dob + hq * stride_doh
        lrow = (b64 * HQ + hq) * Tq
        dck = tl.zeros([BN], tl.float32)
        dk, dv, dck = _bwd_dkv_inner(dk, dv, dck, k, v, ck, offs_n - off, q_base, do_base, ROWB + lrow,
                                     DELTA + lrow, SEG_START, stride_qt, stride_dot,
                                     row_lo, row_mid, Tq, qk_scale, dq_desc, DQ32 + b64 * stride_dqb + hq * stride_dqh, stride_dqt,
                                     DCQ + lrow, b, hq, scale,
                                     DK_, DV_, BM, True, VARLEN, FUSE_DQ)
        dk, dv, dck = _bwd_dkv_inner(dk, dv, dck, k, v, ck, offs_n - off, q_base, do_base, ROWB + lrow,
                                     DELTA + lrow, SEG_START, stride_qt, stride_dot,
                                     row_full, row_hi, Tq, qk_scale, dq_desc, DQ32 + b64 * stride_dqb + hq * stride_dqh, stride_dqt,
                                     DCQ + lrow, b, hq, scale,
                                     DK_, DV_, BM, False, VARLEN, FUSE_DQ)
        tl.store(DC + crow + offs_n, -dck, mask=nmask)

    tl.store(DK + b64 * stride_dkb + h * stride_dkh + offs_n[:, None] * stride_dkt + offs_dk[None, :],
             (dk * scale).to(DK.dtype.element_ty), mask=nmask[:, None])
    tl.store(DV + b64 * stride_dvb + h * stride_dvh + offs_n[:, None] * stride_dvt + offs_dv[None, :],
             dv.to(DV.dtype.element_ty), mask=nmask[:, None])


@triton.jit
def _bwd_dq_inner(
    dq, dcq, q, do, bq, delta, sq, pq,
    k_base, v_base, ck_base, stride_kt, stride_vt, lo, hi, Tk, qk_scale,
    DK: tl.constexpr, DV: tl.constexpr, BN: tl.constexpr,
    MASKED: tl.constexpr, VARLEN: tl.constexpr,
):
    offs_dk = tl.arange(0, DK)
    offs_dv = tl.arange(0, DV)
    for start_n in range(lo, hi, BN):
        offs_n = start_n + tl.arange(0, BN)
        if MASKED:
            nmask = offs_n < Tk
            kT = tl.load(k_base + offs_n[None, :] * stride_kt + offs_dk[:, None], mask=nmask[None, :], other=0.0)
            vT = tl.load(v_base + offs_n[None, :] * stride_vt + offs_dv[:, None], mask=nmask[None, :], other=0.0)
            ck = tl.load(ck_base + offs_n, mask=nmask, other=0.0)
        else:
            kT = tl.load(k_base + offs_n[None, :] * stride_kt + offs_dk[:, None])
            vT = tl.load(v_base + offs_n[None, :] * stride_vt + offs_dv[:, None])
            ck = tl.load(ck_base + offs_n)
        s = tl.dot(q, kT) * qk_scale + (bq[:, None] - ck[None, :])
        if MASKED:
            keep = offs_n[None, :] <= pq[:, None]
            if VARLEN:
                keep = keep & (offs_n[None, :] >= sq[:, None])
            s = tl.where(keep, s, float("-inf"))
        elif VARLEN:
            s = tl.where(offs_n[None, :] >= sq[:, None], s, float("-inf"))
        p = tl.math.exp2(s)
        dp = tl.dot(do, vT)
        ds = p * (dp - delta[:, None])
        dcq += tl.sum(ds, 1)
        dq = tl.dot(ds.to(kT.dtype), tl.trans(kT), dq)
    return dq, dcq


@triton.jit
def _bwd_dq_kernel(
    Q, K, V, DO, CK, ROWB, DELTA, DQ, DCQ, SEG_START,
    stride_qb, stride_qt, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_dob, stride_dot, stride_doh,
    stride_dqb, stride_dqt, stride_dqh,
    Tq, Tk, HQ, G, qk_scale, scale,
    DK: tl.constexpr, DV: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
    VARLEN: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    start_m = (tl.num_programs(0) - 1 - pid_m) * BM
    b = pid_bh // HQ
    hq = pid_bh % HQ
    h = hq // G
    b64 = b.to(tl.int64)
    off = Tk - Tq
    offs_m = start_m + tl.arange(0, BM)
    mmask = offs_m < Tq
    offs_dk = tl.arange(0, DK)
    offs_dv = tl.arange(0, DV)

    q = tl.load(Q + b64 * stride_qb + hq * stride_qh + offs_m[:, None] * stride_qt + offs_dk[None, :],
                mask=mmask[:, None], other=0.0)
    do = tl.load(DO + b64 * stride_dob + hq * stride_doh + offs_m[:, None] * stride_dot + offs_dv[None, :],
                 mask=mmask[:, None], other=0.0)
    crow = (b64 * HQ + hq) * Tk
    lrow = (b64 * HQ + hq) * Tq
    pq = offs_m + off
    bq = tl.load(ROWB + lrow + offs_m, mask=mmask, other=float("-inf"))
    delta = tl.load(DELTA + lrow + offs_m, mask=mmask, other=0.0)
    if VARLEN:
        sq = tl.load(SEG_START + offs_m, mask=mmask, other=0)
        lo = (tl.load(SEG_START + start_m) // BN) * BN
    else:
        sq = offs_m  # unused
        lo = 0
    full_hi = ((start_m + off + 1) // BN) * BN
    hi = tl.minimum(start_m + BM + off, Tk)
    k_base = K + b64 * stride_kb + h * stride_kh
    v_base = V + b64 * stride_vb + h * stride_vh

    dq = tl.zeros([BM, DK], tl.float32)
    dcq = tl.zeros([BM], tl.float32)
    dq, dcq = _bwd_dq_inner(dq, dcq, q, do, bq, delta, sq, pq, k_base, v_base, CK + crow, stride_kt, stride_vt,
                            lo, full_hi, Tk, qk_scale, DK, DV, BN, False, VARLEN)
    dq, dcq = _bwd_dq_inner(dq, dcq, q, do, bq, delta, sq, pq, k_base, v_base, CK + crow, stride_kt, stride_vt,
                            full_hi, hi, Tk, qk_scale, DK, DV, BN, True, VARLEN)
    # row sums of dS: zero in exact arithmetic, but they cancel the rounding of o (via delta) in dg
    tl.store(DCQ + lrow + offs_m, dcq, mask=mmask)
    tl.store(DQ + b64 * stride_dqb + hq * stride_dqh + offs_m[:, None] * stride_dqt + offs_dk[None, :],
             (dq * scale).to(DQ.dtype.element_ty), mask=mmask[:, None])


# --------------------------------------------------------------------------------------
# host side
# --------------------------------------------------------------------------------------
def _seg_bounds(cu_seqlens: torch.Tensor, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position, the start and end of its document (int32, no host sync)."""
    cu = cu_seqlens.to(torch.int64)
    pos = torch.arange(T, device=cu.device)
    doc = torch.searchsorted(cu[1:], pos, right=True).clamp_(max=cu.numel() - 2)
    return cu[doc].to(torch.int32).contiguous(), cu[doc + 1].to(torch.int32).contiguous()


def _prep_c(g: torch.Tensor, attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Cumulative log gates in log2 units, laid out [B, HQ, Tk] (fp32): (query side, key side)."""
    # transpose first: torch's scan along a non-innermost dim is a slow serial kernel
    c = g.float().transpose(1, 2).contiguous().cumsum(-1).mul_(LOG2E)
    if attention_mask is None:
        return c, c
    pad = (attention_mask == 0)[:, None, :]
    return c, c.masked_fill(pad, float("inf"))


def _last_contig(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _fwd(q, k, v, cq, ck, scale, seg_start, cfg=None):
    """Returns o and the per-row backward bias rowb = c_q - lse (log2 units, [B, HQ, Tq])."""
    B, Tq, HQ, DK = q.shape
    Tk, H, DV = k.shape[1], k.shape[2], v.shape[-1]
    BM, BN, nw, ns = (cfg or _config(max(DK, DV)))["fwd"]
    o = torch.empty(B, Tq, HQ, DV, device=q.device, dtype=q.dtype)
    rowb = torch.empty(B, HQ, Tq, device=q.device, dtype=torch.float32)
    varlen = seg_start is not None
    LAST_KERNEL["fwd"] = _fwd_kernel[(triton.cdiv(Tq, BM), B * HQ)](
        q, k, v, cq, ck, o, rowb, seg_start if varlen else cq,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        o.stride(0), o.stride(1), o.stride(2),
        Tq, Tk, HQ, HQ // H, scale * LOG2E,
        DK=DK, DV=DV, BM=BM, BN=BN, VARLEN=varlen, num_warps=nw, num_stages=ns,
    )
    return o, rowb


def _delta(o, do):
    B, Tq, HQ, DV = o.shape
    delta = torch.empty(B, HQ, Tq, device=o.device, dtype=torch.float32)
    _delta_kernel[(triton.cdiv(Tq, 64), B * HQ)](
        o, do, delta, o.stride(0), o.stride(1), o.stride(2), do.stride(0), do.stride(1), do.stride(2),
        Tq, HQ, DV=DV, BM=64, num_warps=4,
    )
    return delta


def _dkv(do, q, k, v, ck, rowb, delta, scale, seg_start, seg_end, cfg=None):
    """dk, dv, dc (key-side bias grad); with cfg["fuse_dq"] also dq and dcq (else None)."""
    B, Tq, HQ, DK = q.shape
    Tk, H, DV = k.shape[1], k.shape[2], v.shape[-1]
    cfg = cfg or _config(max(DK, DV))
    BM, BN, nw, ns = cfg["dkv"]
    fuse = int(cfg.get("fuse_dq", 0))
    varlen = seg_start is not None
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    dc = torch.empty(B, HQ, Tk, device=q.device, dtype=torch.float32)
    if fuse:
        dq32 = torch.zeros(B, Tq, HQ, DK, device=q.device, dtype=torch.float32)
        dcq = torch.zeros(B, HQ, Tq, device=q.device, dtype=torch.float32)
        dq_desc = TensorDescriptor.from_tensor(dq32, [1, BM, 1, DK]) if fuse == 2 else dq32
    else:
        dq32 = dcq = None
        dq_desc = delta
    LAST_KERNEL["dkv"] = _bwd_dkv_kernel[(triton.cdiv(Tk, BN), B * H)](
        q, k, v, do, ck, rowb, delta, dk, dv, dc,
        seg_start if varlen else delta, seg_end if varlen else delta, dq_desc,
        dq32 if fuse else delta, dcq if fuse else delta,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        do.stride(0), do.stride(1), do.stride(2),
        dk.stride(0), dk.stride(1), dk.stride(2),
        dv.stride(0), dv.stride(1), dv.stride(2),
        *((dq32.stride(0), dq32.stride(1), dq32.stride(2)) if fuse else (0, 0, 0)),
        Tq, Tk, HQ, H, HQ // H, scale * LOG2E, scale,
        DK_=DK, DV_=DV, BM=BM, BN=BN, VARLEN=varlen, FUSE_DQ=fuse, num_warps=nw, num_stages=ns,
    )
    return dk, dv, dc, (dq32.to(q.dtype) if fuse else None), dcq


def _dq(do, q, k, v, ck, rowb, delta, scale, seg_start, cfg=None):
    B, Tq, HQ, DK = q.shape
    Tk, H, DV = k.shape[1], k.shape[2], v.shape[-1]
    BM, BN, nw, ns = (cfg or _config(max(DK, DV)))["dq"]
    varlen = seg_start is not None
    dq = torch.empty_like(q)
    dcq = torch.empty(B, HQ, Tq, device=q.device, dtype=torch.float32)
    LAST_KERNEL["dq"] = _bwd_dq_kernel[(triton.cdiv(Tq, BM), B * HQ)](
        q, k, v, do, ck, rowb, delta, dq, dcq, seg_start if varlen else delta,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        do.stride(0), do.stride(1), do.stride(2),
        dq.stride(0), dq.stride(1), dq.stride(2),
        Tq, Tk, HQ, HQ // H, scale * LOG2E, scale,
        DK=DK, DV=DV, BM=BM, BN=BN, VARLEN=varlen, num_warps=nw, num_stages=ns,
    )
    return dq, dcq


def _bwd(do, q, k, v, o, ck, rowb, scale, seg_start, seg_end, cfg=None):
    delta = _delta(o, do)
    dk, dv, dc, dq, dcq = _dkv(do, q, k, v, ck, rowb, delta, scale, seg_start, seg_end, cfg)
    if dq is None:
        dq, dcq = _dq(do, q, k, v, ck, rowb, delta, scale, seg_start, cfg)
    # dL/dc_m = rowsum_i(dS) [p_i = m] - colsum_m(dS);  dg_t = sum_{m >= t} dL/dc_m
    dc[:, :, k.shape[1] - q.shape[1]:] += dcq
    dg = dc.flip(-1).cumsum(-1).flip(-1).transpose(1, 2)
    return dq, dk, dv, dg


class ForgettingAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, scale, cu_seqlens, attention_mask):
        q, k, v = _last_contig(q), _last_contig(k), _last_contig(v)
        cq, ck = _prep_c(g, attention_mask)
        seg_start = seg_end = None
        if cu_seqlens is not None:
            seg_start, seg_end = _seg_bounds(cu_seqlens, q.shape[1])
        o, rowb = _fwd(q, k, v, cq, ck, scale, seg_start)
        ctx.save_for_backward(q, k, v, o, ck, rowb, seg_start, seg_end)
        ctx.scale = scale
        ctx.g_dtype = g.dtype
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, ck, rowb, seg_start, seg_end = ctx.saved_tensors
        do = _last_contig(do)
        dq, dk, dv, dg = _bwd(do, q, k, v, o, ck, rowb, ctx.scale, seg_start, seg_end)
        return dq, dk, dv, dg.to(ctx.g_dtype), None, None, None


def supports(q, k, v, g, cu_seqlens=None, attention_mask=None) -> bool:
    """Whether the Triton kernel handles this call (else use the PyTorch op)."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or g.dim() != 3:
        return False
    B, Tq, HQ, DK = q.shape
    Bk, Tk, H, DKk = k.shape
    if Bk != B or DKk != DK or v.shape[:3] != k.shape[:3] or tuple(g.shape) != (B, Tk, HQ):
        return False
    DV = v.shape[-1]
    if H == 0 or HQ % H != 0 or Tq > Tk or Tq == 0:
        return False
    pow2 = lambda d: 16 <= d <= 128 and (d & (d - 1)) == 0  # noqa: E731
    if not (pow2(DK) and pow2(DV)):
        return False
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32) or not (q.dtype == k.dtype == v.dtype):
        return False
    if q.dtype == torch.float32 and not _INTERPRET:
        # fp32 tiles are twice as large: the pinned configs run out of shared memory on an
        # H100 (seen at D=128); fp32 calls take the PyTorch path
        return False
    if cu_seqlens is not None and (B != 1 or Tq != Tk or attention_mask is not None):
        return False
    if attention_mask is not None and tuple(attention_mask.shape) != (B, Tk):
        return False
    return True


def parallel_forgetting_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float | None = None,
    cu_seqlens: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Forgetting attention (FoX), Triton forward and backward.

    Args:
        q: ``[B, Tq, HQ, K]`` queries.
        k: ``[B, Tk, H, K]`` keys, ``HQ % H == 0`` (GQA), ``Tq <= Tk``.
        v: ``[B, Tk, H, V]`` values.
        g: ``[B, Tk, HQ]`` log forget gates (<= 0), any float dtype; cumulated in fp32.
        scale: logit scale, default ``K ** -0.5``.
        cu_seqlens: optional ``[N+1]`` document offsets for packed input (``B == 1``,
            ``Tq == Tk``); no attention across documents.
        attention_mask: optional ``[B, Tk]``, 0 marks a padded key; rows that see no
            key output 0.

    K and V must be powers of two in [16, 128]; q, k, v fp16 or bf16 of one dtype (fp32
    only in Triton's CPU interpreter, for tests).  g may be any float dtype.  Returns ``o`` ``[B, Tq, HQ, V]`` in q's dtype.
    """
    if not supports(q, k, v, g, cu_seqlens, attention_mask):
        raise ValueError(
            "parallel_forgetting_attention_triton: unsupported call "
            f"(q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, g {tuple(g.shape)}, "
            f"dtype {q.dtype}, cu_seqlens {cu_seqlens is not None}, attention_mask {attention_mask is not None})"
        )
    if scale is None:
        scale = q.shape[-1] ** -0.5
    return ForgettingAttentionFunction.apply(q, k, v, g, float(scale), cu_seqlens, attention_mask)
