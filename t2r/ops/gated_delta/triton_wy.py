"""Triton WY kernels of the gated delta rule (see triton_chunk.py): per chunk and kv head, fully parallel
over chunks. Forward: W = X diag(beta gamma) K, U' = X diag(beta) V from the gate cumsum b and
X = (I + A)^-1 of triton_solve.py.
Backward: dv, dbeta and the parts of dk and of the gate gradient that flow through W and U'.

No transposed tile is ever made with tl.trans: every transposed operand is loaded transposed from memory
(a block pointer with swapped strides), which sidesteps the Triton 3.6 Hopper miscompile of a transposed
accumulator fed into a dot (fla issue #640)."""
import triton
import triton.language as tl

from ..triton_utils import chunk_bounds


@triton.jit
def _rows(x, bos, i_h, i_t, T, H: tl.constexpr, BT: tl.constexpr):
    """The [BT] values of a per-(step, kv head) tensor [.., T, H] for chunk i_t, fp32, 0 past the end."""
    o_t = i_t * BT + tl.arange(0, BT)
    return tl.load(x + (bos + o_t) * H + i_h, mask=o_t < T, other=0.).to(tl.float32)


@triton.jit
def _last_row(x, bos, i_h, i_t, T, H: tl.constexpr, BT: tl.constexpr):
    """The value of a per-(step, kv head) tensor at the last step of chunk i_t inside the sequence."""
    last = tl.minimum(T, (i_t + 1) * BT) - 1
    return tl.load(x + (bos + last) * H + i_h).to(tl.float32)


@triton.jit
def _decay(b_b, n_valid, STRICT: tl.constexpr, TRANSPOSED: tl.constexpr, BT: tl.constexpr):
    """E_ij = exp(b_i - b_j) for j <= i (j < i if STRICT) among the first n_valid rows of the chunk, else
    exactly 0 (masked before exp: past the sequence's end b reads 0, and exp(0 - b_j) could overflow);
    [j, i] when TRANSPOSED."""
    o_i = tl.arange(0, BT)
    valid = o_i < n_valid
    if TRANSPOSED:
        keep = (o_i[None, :] > o_i[:, None]) if STRICT else (o_i[None, :] >= o_i[:, None])
        keep = keep & valid[None, :]
        return tl.exp(tl.where(keep, b_b[None, :] - b_b[:, None], float("-inf")))
    keep = (o_i[:, None] > o_i[None, :]) if STRICT else (o_i[:, None] >= o_i[None, :])
    keep = keep & valid[:, None]
    return tl.exp(tl.where(keep, b_b[:, None] - b_b[None, :], float("-inf")))


@triton.jit(do_not_specialize=["T"])
def _wy_fwd_kernel(
    k, v, beta, bcum, ainv, w, u_part, cu_seqlens, chunk_indices, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    # W = X diag(beta gamma) K and U' = X diag(beta) V, with b and X = (I + A)^-1 from _wy_inverse_kernel
    i_tc, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    i_t, bos, T, _ = chunk_bounds(i_tc, i_b, T, cu_seqlens, chunk_indices, BT, IS_VARLEN)
    b_b = _rows(bcum, bos, i_h, i_t, T, H, BT)
    b_beta = _rows(beta, bos, i_h, i_t, T, H, BT)
    p_x = tl.make_block_ptr(ainv + (bos * H + i_h) * BT, (T, BT), (H * BT, 1), (i_t * BT, 0), (BT, BT), (1, 0))
    b_x = tl.load(p_x, boundary_check=(0, 1))

    b_kscale = b_beta * tl.exp(b_b)
    for i_k in range(tl.cdiv(K, BK)):
        p_k = tl.make_block_ptr(k + (bos * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, i_k * BK), (BT, BK), (1, 0))
        p_w = tl.make_block_ptr(w + (bos * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, i_k * BK), (BT, BK), (1, 0))
        b_k = tl.load(p_k, boundary_check=(0, 1)).to(tl.float32) * b_kscale[:, None]
        tl.store(p_w, tl.dot(b_x, b_k).to(p_w.dtype.element_ty), boundary_check=(0, 1))
    for i_v in range(tl.cdiv(V, BV)):
        p_v = tl.make_block_ptr(v + (bos * H + i_h) * V, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
        p_u = tl.make_block_ptr(u_part + (bos * H + i_h) * V, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV),
                                (1, 0))
        b_v = tl.load(p_v, boundary_check=(0, 1)).to(tl.float32) * b_beta[:, None]
        tl.store(p_u, tl.dot(b_x, b_v).to(p_u.dtype.element_ty), boundary_check=(0, 1))


@triton.jit(do_not_specialize=["T"])
def _wy_bwd_kernel(
    k, v, beta, bcum, ainv, h, du, dv, dk_part, dbeta, db_part, dgram, cu_seqlens, chunk_indices, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    # Through U = X diag(beta) V - W S and W = X diag(beta gamma) K (S: state entering the chunk, dU given):
    #   dW = -dU S^T,  dX = dW (beta gamma K)^T + dU (beta V)^T,  d(beta V) = X^T dU,  d(beta gamma K) = X^T dW,
    #   dA = -X^T dX X^T (strictly lower), A_ij = beta_i G_ij E_ij with G = K K^T;
    # stores dv, dbeta (final), dk and db (= gradient of the gate cumsum) so far, and dG = dA beta_i E_ij.
    i_tc, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    i_t, bos, T, i_c = chunk_bounds(i_tc, i_b, T, cu_seqlens, chunk_indices, BT, IS_VARLEN)
    o_i = tl.arange(0, BT)
    o_t = i_t * BT + o_i
    m_t = o_t < T
    b_b = _rows(bcum, bos, i_h, i_t, T, H, BT)
    b_beta = _rows(beta, bos, i_h, i_t, T, H, BT)
    b_gamma = tl.exp(b_b)
    p_xt = tl.make_block_ptr(ainv + (bos * H + i_h) * BT, (BT, T), (1, H * BT), (0, i_t * BT), (BT, BT), (0, 1))
    b_xt = tl.load(p_xt, boundary_check=(0, 1))

    b_dw = tl.zeros([BT, BK], dtype=tl.float32)
    b_dx = tl.zeros([BT, BT], dtype=tl.float32)
    b_dbeta = tl.zeros([BT], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        p_du = tl.make_block_ptr(du + (bos * H + i_h) * V, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
        p_ht = tl.make_block_ptr(h + (i_c * H + i_h) * K * V, (V, K), (1, V), (i_v * BV, 0), (BV, BK), (0, 1))
        p_v = tl.make_block_ptr(v + (bos * H + i_h) * V, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
        p_vt = tl.make_block_ptr(v + (bos * H + i_h) * V, (V, T), (1, H * V), (i_v * BV, i_t * BT), (BV, BT), (0, 1))
        p_dv = tl.make_block_ptr(dv + (bos * H + i_h) * V, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
        b_du = tl.load(p_du, boundary_check=(0, 1))
        b_ht = tl.load(p_ht, boundary_check=(0, 1))
        b_dw -= tl.dot(b_du.to(b_ht.dtype), b_ht)
        b_vt = tl.load(p_vt, boundary_check=(0, 1)).to(tl.float32) * b_beta[None, :]
        b_dx += tl.dot(b_du, b_vt)
        b_dvb = tl.dot(b_xt, b_du)                                   # d(beta V)
        b_dbeta += tl.sum(b_dvb * tl.load(p_v, boundary_check=(0, 1)).to(tl.float32), axis=1)
        tl.store(p_dv, (b_dvb * b_beta[:, None]).to(p_dv.dtype.element_ty), boundary_check=(0, 1))

    p_k = tl.make_block_ptr(k + (bos * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, 0), (BT, BK), (1, 0))
    p_kt = tl.make_block_ptr(k + (bos * H + i_h) * K, (K, T), (1, H * K), (0, i_t * BT), (BK, BT), (0, 1))
    b_k = tl.load(p_k, boundary_check=(0, 1)).to(tl.float32)
    b_kt = tl.load(p_kt, boundary_check=(0, 1)).to(tl.float32)
    b_dx += tl.dot(b_dw, b_kt * (b_beta * b_gamma)[None, :])
    b_dkbg = tl.dot(b_xt, b_dw)                                      # d(beta gamma K)
    b_dk = b_dkbg * (b_beta * b_gamma)[:, None]
    b_kdk = tl.sum(b_dkbg * b_k, axis=1)
    b_dbeta += b_kdk * b_gamma
    b_db = b_kdk * b_beta * b_gamma

    b_da = -tl.dot(tl.dot(b_xt, b_dx), b_xt)
    b_dae = b_da * _decay(b_b, T - i_t * BT, True, False, BT)        # dA (.) E, strictly lower
    b_gram = tl.dot(b_k, b_kt)
    b_dbeta += tl.sum(b_dae * b_gram, axis=1)
    b_term = b_dae * b_gram * b_beta[:, None]                        # dA_ij * A_ij: d/db_i, -d/db_j
    b_db += tl.sum(b_term, axis=1) - tl.sum(b_term, axis=0)

    p_dg = tl.make_block_ptr(dgram + (bos * H + i_h) * BT, (T, BT), (H * BT, 1), (i_t * BT, 0), (BT, BT), (1, 0))
    tl.store(p_dg, b_dae * b_beta[:, None], boundary_check=(0, 1))
    p_dk = tl.make_block_ptr(dk_part + (bos * H + i_h) * K, (T, K), (H * K, 1), (i_t * BT, 0), (BT, BK), (1, 0))
    tl.store(p_dk, b_dk, boundary_check=(0, 1))
    tl.store(dbeta + (bos + o_t) * H + i_h, b_dbeta.to(dbeta.dtype.element_ty), mask=m_t)
    tl.store(db_part + (bos + o_t) * H + i_h, b_db, mask=m_t)
