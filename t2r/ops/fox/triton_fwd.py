"""Triton forward kernel of forgetting attention (see triton_parallel.py for the math): one
program per (query block, batch x query head), output and row log-sum-exp in log2 units."""
import triton
import triton.language as tl


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
