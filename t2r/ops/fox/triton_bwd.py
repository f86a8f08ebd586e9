"""Triton backward kernels of forgetting attention (see triton_parallel.py for the math):
delta = do . o, dk / dv (and the key-side gate gradient) per kv head looping its query heads,
and dq (with the query-side row sums) per query head."""
import triton
import triton.language as tl


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
    # grid (B * H, key blocks), heads fastest: the first key blocks (most query rows) start first
    pid_bh = tl.program_id(0)
    pid_n = tl.program_id(1)
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
                                     row_lo, row_mid, Tq, qk_scale, dq_desc, DQ32 + b64 * stride_dqb + hq * stride_dqh,
                                     stride_dqt,
                                     DCQ + lrow, b, hq, scale,
                                     DK_, DV_, BM, True, VARLEN, FUSE_DQ)
        dk, dv, dck = _bwd_dkv_inner(dk, dv, dck, k, v, ck, offs_n - off, q_base, do_base, ROWB + lrow,
                                     DELTA + lrow, SEG_START, stride_qt, stride_dot,
                                     row_full, row_hi, Tq, qk_scale, dq_desc, DQ32 + b64 * stride_dqb + hq * stride_dqh,
                                     stride_dqt,
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
