"""Shared Triton pieces of the GSA kernels (see triton_chunk.py for the algorithm): tile loads,
the in-chunk gate cumsum, and the anchored decay factors and mixes that put the per-slot decay
2^(b_i - b_j) on tensor cores. The anchor block size bs is a compile-time constant: BT (one
anchor per chunk: the block loops have one trip and fold away) or BS (one per sub-block: real
loops, not unrolled); each variant is its own compilation and launch (triton_intra.py)."""
import os

import triton
import triton.language as tl

from ..triton_utils import RCP_LN2

_LOG2E = tl.constexpr(RCP_LN2)
_CLAMP = tl.constexpr(100.0)
# fp32 inputs: tensor-core dots in tf32 (default) or exact fp32 FMA ("ieee").
_PREC = tl.constexpr(os.environ.get("T2R_GSA_FP32_DOT", "tf32"))


@triton.jit
def _dot(a, b):
    if a.dtype == tl.float32:
        return tl.dot(a, b, input_precision=_PREC)
    else:
        return tl.dot(a, b)


@triton.jit
def _dot_acc(a, b, acc):
    """acc + a @ b, accumulated in the product."""
    if a.dtype == tl.float32:
        return tl.dot(a, b, acc, input_precision=_PREC)
    else:
        return tl.dot(a, b, acc)


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
def _load_cols(x, bos, i_t, T, i_h, i_d, NH: tl.constexpr, D: tl.constexpr,
               BT: tl.constexpr, BC: tl.constexpr):
    """Columns [i_d*BC, +BC) of the rows of _load_rows: a [BT, BC] tile."""
    p = tl.make_block_ptr(x + (bos * NH + i_h) * D, (T, D), (NH * D, 1), (i_t * BT, i_d * BC), (BT, BC), (1, 0))
    return tl.load(p, boundary_check=(0, 1))


@triton.jit
def _store_cols(x, val, bos, i_t, T, i_h, i_d, NH: tl.constexpr, D: tl.constexpr,
                BT: tl.constexpr, BC: tl.constexpr):
    p = tl.make_block_ptr(x + (bos * NH + i_h) * D, (T, D), (NH * D, 1), (i_t * BT, i_d * BC), (BT, BC), (1, 0))
    tl.store(p, val.to(p.dtype.element_ty), boundary_check=(0, 1))


@triton.jit
def _gate_cumsum(g, bos, i_t, T, i_h, H: tl.constexpr, M: tl.constexpr, BT: tl.constexpr, BM: tl.constexpr):
    """b [BT, BM]: log2 cumulative slot decay inside the chunk (padded rows repeat the last)."""
    b_g = _load_rows(g, bos, i_t, T, i_h, H, M, BT, BM).to(tl.float32) * _LOG2E
    return tl.cumsum(b_g, axis=0)


@triton.jit
def _row_anchor(b, I, bs: tl.constexpr, BT: tl.constexpr):
    """b at the anchor (middle) row of row block I of bs rows: [BM]."""
    o_i = tl.arange(0, BT)
    return tl.sum(tl.where((o_i == I * bs + bs // 2)[:, None], b, 0.), axis=0)


@triton.jit
def _in_block(I, bs: tl.constexpr, BT: tl.constexpr):
    o_i = tl.arange(0, BT)
    return ((o_i >= I * bs) & (o_i < I * bs + bs))[:, None]


@triton.jit
def _anchor_factor(b, bs: tl.constexpr, BT: tl.constexpr):
    """F_i = 2^(b_i - b_a(i)) with a(i) the anchor row of i's block: [BT, BM]."""
    b_anc = tl.zeros_like(b)
    for I in range(BT // bs):
        b_anc += tl.where(_in_block(I, bs, BT), _row_anchor(b, I, bs, BT)[None, :], 0.)
    return tl.exp2(tl.minimum(b - b_anc, _CLAMP))


@triton.jit
def _key_factor(b, I, bs: tl.constexpr, BT: tl.constexpr):
    """H^I_j = 2^(b_a(I) - b_j) for keys j up to the end of row block I, else 0: [BT, BM]."""
    m_k = tl.arange(0, BT) < I * bs + bs
    b_a = _row_anchor(b, I, bs, BT)
    return tl.where(m_k[:, None], tl.exp2(tl.minimum(b_a[None, :] - b, _CLAMP)), 0.)


@triton.jit
def _factors(b, s, like, bs: tl.constexpr, BT: tl.constexpr):
    """The chunk's decay factors, as the tuple the mixes below take; F = fac[0] always.
    One anchor (bs == BT): (F, s * H in like's dtype, b_a [BM]) with F = 2^(b - b_a) and
    H = 2^(b_a - b) = 1 / F (no clamping: fits_one_anchor bounds both exponents), so each mix is
    one product and b dies here (fewer live registers). Sub-blocks (bs == BS): (F, s, b)."""
    if bs == BT:
        b_a = _row_anchor(b, 0, BT, BT)
        fac = (tl.exp2(b - b_a[None, :]), (s * tl.exp2(b_a[None, :] - b)).to(like.dtype), b_a)
    else:
        fac = (_anchor_factor(b, bs, BT), s, b)
    return fac


@triton.jit
def _decay(fac, bs: tl.constexpr, BT: tl.constexpr):
    """Lam = 2^b [BT, BM], the decay from the chunk start."""
    if bs == BT:
        lam = fac[0] * tl.exp2(fac[2])[None, :]
    else:
        lam = tl.exp2(fac[2])
    return lam


@triton.jit
def _decay_to_end(fac, b_last, bs: tl.constexpr, BT: tl.constexpr):
    """Gam = 2^(b_last - b) [BT, BM], the decay from each step to the chunk end (b_last [BM])."""
    if bs == BT:
        gam = tl.exp2(b_last - fac[2])[None, :] / fac[0]
    else:
        gam = tl.exp2(b_last[None, :] - fac[2])
    return gam


@triton.jit
def _mix(A, fac, bs: tl.constexpr, BT: tl.constexpr):
    """mix(X, s) of the module docstring for X = A [BT, BT] (in the dot dtype): [BT, BM] fp32."""
    if bs == BT:
        acc = _dot(A, fac[1])
    else:
        acc = tl.zeros_like(fac[0])
        for I in range(BT // bs):
            sh = (fac[1] * _key_factor(fac[2], I, bs, BT)).to(A.dtype)
            acc += tl.where(_in_block(I, bs, BT), _dot(A, sh), 0.)
    return fac[0] * acc


@triton.jit
def _mix_t(X, fac, like, bs: tl.constexpr, BT: tl.constexpr):
    """[BT, BT]: entry (i, j) = sum_m X_i[m] s_j[m] 2^(b_i[m] - b_j[m]) for X = Y * F (fp32); the
    lower triangle is the pass-2 matrix A2 (or dA1 in the backward). Dots in like's dtype."""
    if bs == BT:
        acc = _dot(X.to(like.dtype), tl.trans(fac[1]))
    else:
        acc = tl.zeros([BT, BT], dtype=tl.float32)
        for I in range(BT // bs):
            sh = (fac[1] * _key_factor(fac[2], I, bs, BT)).to(like.dtype)
            acc += _dot(tl.where(_in_block(I, bs, BT), X, 0.).to(like.dtype), tl.trans(sh))
    return acc


@triton.jit
def _mix_bwd(X, Y, ds, fac, bs: tl.constexpr, BT: tl.constexpr):
    """The two products of the backward kernels for X = Y' * F (fp32), Y [BT, BT] (dot dtype):
    (sum_I (s * H^I) @ X_I^T [BT, BT] (keys j, rows i), ds + sum_I H^I * (Y @ X_I) [BT, BM]).
    One anchor: H = 1 / F is left to _mix_bwd_end, so ds accumulates Y @ X in the product itself
    (one division after a query-head loop instead of one per step)."""
    if bs == BT:
        x = X.to(Y.dtype)
        acc = _dot(fac[1], tl.trans(x))
        ds = _dot_acc(Y, x, ds)
    else:
        acc = tl.zeros([BT, BT], dtype=tl.float32)
        for I in range(BT // bs):
            h = _key_factor(fac[2], I, bs, BT)
            x = tl.where(_in_block(I, bs, BT), X, 0.).to(Y.dtype)
            acc += _dot((fac[1] * h).to(Y.dtype), tl.trans(x))
            ds += h * _dot(Y, x)
    return acc, ds


@triton.jit
def _mix_bwd_end(ds, fac, bs: tl.constexpr, BT: tl.constexpr):
    """ds summed by _mix_bwd, with the one-anchor factor H = 1 / F applied."""
    if bs == BT:
        ds = ds / fac[0]
    return ds


@triton.jit
def _softmax_rows(z, M: tl.constexpr, BM: tl.constexpr):
    o_m = tl.arange(0, BM)
    z = tl.where((o_m < M)[None, :], z, float("-inf"))
    e = tl.exp2((z - tl.max(z, axis=1)[:, None]) * _LOG2E)
    return e / tl.sum(e, axis=1)[:, None]
