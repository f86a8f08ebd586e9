"""Triton kernel of the gated delta rule's WY inverse (see triton_chunk.py): per chunk and kv head, the gate
cumsum b and X = (I + A)^-1 with A_ij = beta_i (k_i . k_j) exp(b_i - b_j), j < i (strictly lower), in fp32.

The 64-step chunk is cut into four blocks of BC = 16 steps (as fla's solve_tril): the ten blocks of A come
from 16-row tiles of K, the four diagonal blocks are inverted by forward substitution (row by row, the four
blocks side by side in one 15-step loop), and the blocks below the diagonal follow from

    X_rc = -X_rr sum_{c <= m < r} A_rm X_mc            (block row r, column c < r),

with exact fp32 16x16x16 dots. Inverting the whole 64 x 64 tile at once costs 16 times the substitution work,
or a dozen 64x64x64 fp32 FMA dots by block doubling (most of the forward's time and of its compile time).
Transposed operands are loaded transposed, never made with tl.trans (see triton_wy.py)."""
import triton
import triton.language as tl

from ..triton_utils import chunk_bounds
from .triton_wy import _rows


@triton.jit
def _k_rows(k, bos, i_h, r0, T, H: tl.constexpr, K: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr):
    """Rows r0 .. r0 + BC of the keys of kv head i_h: [BC, BK], 0 past the end."""
    p = tl.make_block_ptr(k + (bos * H + i_h) * K, (T, K), (H * K, 1), (r0, 0), (BC, BK), (1, 0))
    return tl.load(p, boundary_check=(0, 1))


@triton.jit
def _k_cols(k, bos, i_h, r0, T, H: tl.constexpr, K: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr):
    """The same rows, transposed: [BK, BC]."""
    p = tl.make_block_ptr(k + (bos * H + i_h) * K, (K, T), (1, H * K), (0, r0), (BK, BC), (0, 1))
    return tl.load(p, boundary_check=(0, 1))


@triton.jit
def _a_block(b_kk, b_beta_r, b_r, b_c, m_r, DIAGONAL: tl.constexpr, BC: tl.constexpr):
    """Block (r, c) of A from K_r K_c^T: beta_i exp(b_i - b_j) (k_i . k_j), rows past the sequence's end 0
    (masked before exp), and j < i on the diagonal."""
    o = tl.arange(0, BC)
    keep = m_r[:, None] & (o[None, :] >= 0)
    if DIAGONAL:
        keep = keep & (o[:, None] > o[None, :])
    return b_kk * tl.exp(tl.where(keep, b_r[:, None] - b_c[None, :], float("-inf"))) * b_beta_r[:, None]


@triton.jit
def _substitute_row(b_y, b_a, i, BC: tl.constexpr):
    """Row i of Y = (I + A)^-1 - I (A strictly lower), rows < i done: Y_i = -a_i - sum_j a_ij Y_j."""
    o = tl.arange(0, BC)
    b_ai = tl.sum(tl.where(o[:, None] == i, b_a, 0.), axis=0)
    b_yi = -b_ai - tl.sum(b_ai[:, None] * b_y, axis=0)
    return tl.where(o[:, None] == i, b_yi[None, :], b_y)


@triton.jit
def _mm(a, b):
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _store_block(ainv, b_x, bos, i_h, r0, c0, T, H: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    p = tl.make_block_ptr(ainv + (bos * H + i_h) * BT, (T, BT), (H * BT, 1), (r0, c0), (BC, BC), (1, 0))
    tl.store(p, b_x, boundary_check=(0, 1))


@triton.jit(do_not_specialize=["T"])
def _wy_inverse_kernel(
    k, g, beta, bcum, ainv, cu_seqlens, chunk_indices, T,
    H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    i_tc, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    i_t, bos, T, _ = chunk_bounds(i_tc, i_b, T, cu_seqlens, chunk_indices, BT, IS_VARLEN)
    tl.static_assert(BT == 64, "four blocks of 16 steps")
    BC: tl.constexpr = BT // 4
    t0 = i_t * BT
    o_c = tl.arange(0, BC)
    m0, m1, m2, m3 = t0 + o_c < T, t0 + BC + o_c < T, t0 + 2 * BC + o_c < T, t0 + 3 * BC + o_c < T

    # gate cumsum inside the chunk, block by block (0 past the sequence's end); every other kernel reads it
    b_g0, b_g1 = _rows(g, bos, i_h, 4 * i_t, T, H, BC), _rows(g, bos, i_h, 4 * i_t + 1, T, H, BC)
    b_g2, b_g3 = _rows(g, bos, i_h, 4 * i_t + 2, T, H, BC), _rows(g, bos, i_h, 4 * i_t + 3, T, H, BC)
    b_b0 = tl.cumsum(b_g0, axis=0)
    b_b1 = tl.cumsum(b_g1, axis=0) + tl.sum(b_g0, axis=0)
    b_b2 = tl.cumsum(b_g2, axis=0) + (tl.sum(b_g0, axis=0) + tl.sum(b_g1, axis=0))
    b_b3 = tl.cumsum(b_g3, axis=0) + (tl.sum(b_g0, axis=0) + tl.sum(b_g1, axis=0) + tl.sum(b_g2, axis=0))
    p_b = bcum + (bos + t0 + o_c) * H + i_h
    tl.store(p_b, b_b0, mask=m0)
    tl.store(p_b + BC * H, b_b1, mask=m1)
    tl.store(p_b + 2 * BC * H, b_b2, mask=m2)
    tl.store(p_b + 3 * BC * H, b_b3, mask=m3)
    b_e0, b_e1 = _rows(beta, bos, i_h, 4 * i_t, T, H, BC), _rows(beta, bos, i_h, 4 * i_t + 1, T, H, BC)
    b_e2, b_e3 = _rows(beta, bos, i_h, 4 * i_t + 2, T, H, BC), _rows(beta, bos, i_h, 4 * i_t + 3, T, H, BC)

    # the ten blocks of A (r >= c) from 16-row tiles of K
    b_k0, b_k1 = _k_rows(k, bos, i_h, t0, T, H, K, BC, BK), _k_rows(k, bos, i_h, t0 + BC, T, H, K, BC, BK)
    b_k2, b_k3 = _k_rows(k, bos, i_h, t0 + 2 * BC, T, H, K, BC, BK), _k_rows(k, bos, i_h, t0 + 3 * BC, T, H, K, BC, BK)
    b_k0t, b_k1t = _k_cols(k, bos, i_h, t0, T, H, K, BC, BK), _k_cols(k, bos, i_h, t0 + BC, T, H, K, BC, BK)
    b_k2t = _k_cols(k, bos, i_h, t0 + 2 * BC, T, H, K, BC, BK)
    b_k3t = _k_cols(k, bos, i_h, t0 + 3 * BC, T, H, K, BC, BK)
    b_a00 = _a_block(tl.dot(b_k0, b_k0t), b_e0, b_b0, b_b0, m0, True, BC)
    b_a11 = _a_block(tl.dot(b_k1, b_k1t), b_e1, b_b1, b_b1, m1, True, BC)
    b_a22 = _a_block(tl.dot(b_k2, b_k2t), b_e2, b_b2, b_b2, m2, True, BC)
    b_a33 = _a_block(tl.dot(b_k3, b_k3t), b_e3, b_b3, b_b3, m3, True, BC)
    b_a10 = _a_block(tl.dot(b_k1, b_k0t), b_e1, b_b1, b_b0, m1, False, BC)
    b_a20 = _a_block(tl.dot(b_k2, b_k0t), b_e2, b_b2, b_b0, m2, False, BC)
    b_a21 = _a_block(tl.dot(b_k2, b_k1t), b_e2, b_b2, b_b1, m2, False, BC)
    b_a30 = _a_block(tl.dot(b_k3, b_k0t), b_e3, b_b3, b_b0, m3, False, BC)
    b_a31 = _a_block(tl.dot(b_k3, b_k1t), b_e3, b_b3, b_b1, m3, False, BC)
    b_a32 = _a_block(tl.dot(b_k3, b_k2t), b_e3, b_b3, b_b2, m3, False, BC)

    # diagonal blocks: Y = X_rr - I by forward substitution (rows 0 and 1 of Y are -A's)
    b_y0, b_y1, b_y2, b_y3 = -b_a00, -b_a11, -b_a22, -b_a33
    for i in range(2, BC):
        b_y0 = _substitute_row(b_y0, b_a00, i, BC)
        b_y1 = _substitute_row(b_y1, b_a11, i, BC)
        b_y2 = _substitute_row(b_y2, b_a22, i, BC)
        b_y3 = _substitute_row(b_y3, b_a33, i, BC)
    eye = tl.where(o_c[:, None] == o_c[None, :], 1., 0.)
    b_x00, b_x11, b_x22, b_x33 = b_y0 + eye, b_y1 + eye, b_y2 + eye, b_y3 + eye

    # below the diagonal: X_rc = -X_rr sum_{c <= m < r} A_rm X_mc
    b_x10 = -_mm(b_x11, _mm(b_a10, b_x00))
    b_x21 = -_mm(b_x22, _mm(b_a21, b_x11))
    b_x32 = -_mm(b_x33, _mm(b_a32, b_x22))
    b_x20 = -_mm(b_x22, _mm(b_a20, b_x00) + _mm(b_a21, b_x10))
    b_x31 = -_mm(b_x33, _mm(b_a31, b_x11) + _mm(b_a32, b_x21))
    b_x30 = -_mm(b_x33, _mm(b_a30, b_x00) + _mm(b_a31, b_x10) + _mm(b_a32, b_x20))

    zero = tl.zeros([BC, BC], dtype=tl.float32)
    _store_block(ainv, b_x00, bos, i_h, t0, 0, T, H, BT, BC)
    _store_block(ainv, zero, bos, i_h, t0, BC, T, H, BT, BC)
    _store_block(ainv, zero, bos, i_h, t0, 2 * BC, T, H, BT, BC)
    _store_block(ainv, zero, bos, i_h, t0, 3 * BC, T, H, BT, BC)
    _store_block(ainv, b_x10, bos, i_h, t0 + BC, 0, T, H, BT, BC)
    _store_block(ainv, b_x11, bos, i_h, t0 + BC, BC, T, H, BT, BC)
    _store_block(ainv, zero, bos, i_h, t0 + BC, 2 * BC, T, H, BT, BC)
    _store_block(ainv, zero, bos, i_h, t0 + BC, 3 * BC, T, H, BT, BC)
    _store_block(ainv, b_x20, bos, i_h, t0 + 2 * BC, 0, T, H, BT, BC)
    _store_block(ainv, b_x21, bos, i_h, t0 + 2 * BC, BC, T, H, BT, BC)
    _store_block(ainv, b_x22, bos, i_h, t0 + 2 * BC, 2 * BC, T, H, BT, BC)
    _store_block(ainv, zero, bos, i_h, t0 + 2 * BC, 3 * BC, T, H, BT, BC)
    _store_block(ainv, b_x30, bos, i_h, t0 + 3 * BC, 0, T, H, BT, BC)
    _store_block(ainv, b_x31, bos, i_h, t0 + 3 * BC, BC, T, H, BT, BC)
    _store_block(ainv, b_x32, bos, i_h, t0 + 3 * BC, 2 * BC, T, H, BT, BC)
    _store_block(ainv, b_x33, bos, i_h, t0 + 3 * BC, 3 * BC, T, H, BT, BC)
