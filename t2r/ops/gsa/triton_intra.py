"""Triton per-chunk kernels of GSA (see triton_chunk.py), fully parallel over chunks: the
forward logits, softmax and outputs, and the three backward kernels (dp and dq per query
head; dk and dv with their parts of ds and of the gate gradient per kv head).

Each kernel is compiled twice, with the anchor block size a compile-time constant, and launched
twice (ONE = True, then False): the one-anchor variant (bs = BT) over every chunk, skipping the
chunks whose gate cumsum is too steep for one anchor (``fits_one_anchor``; the GSA layer's
logsigmoid / 8 gates always fit), then the sub-block variant (bs = BS) over the list of those chunks
only, which is usually empty. ``_fwd_o`` (ONE) classifies the chunks: it writes one flag per
(chunk, kv head) and appends the steep ones to that list, both kept for the backward. Why: one
kernel holding both variants behind a run-time branch had the register budget of the rarely taken
sub-block one; split, the one-anchor kernels run best under other launch configs, and fwd+bwd took
1.98 instead of 2.11 ms at the Mistral layer shape on an H100 (benchmarks/README.md)."""
import triton
import triton.language as tl

from ..triton_utils import chunk_bounds, fits_one_anchor
from .triton_common import (
    _decay,
    _decay_to_end,
    _dot,
    _factors,
    _gate_cumsum,
    _load_cols,
    _load_rows,
    _mix,
    _mix_bwd,
    _mix_bwd_end,
    _mix_t,
    _softmax_rows,
    _store_cols,
    _store_rows,
)


# --------------------------------------------------------------------------------------
# chunk lists: which launch runs which chunk
# --------------------------------------------------------------------------------------
@triton.jit
def _locate(g, cu_seqlens, chunk_indices, i_tc, i_bh, T,
            H: tl.constexpr, M: tl.constexpr, BT: tl.constexpr, BM: tl.constexpr, IS_VARLEN: tl.constexpr):
    """(i_t, bos, T of the sequence, i_c, i_h, gate cumsum b) of chunk i_tc of batch-head i_bh."""
    i_b, i_h = i_bh // H, i_bh % H
    i_t, bos, T, i_c = chunk_bounds(i_tc, i_b, T, cu_seqlens, chunk_indices, BT, IS_VARLEN)
    return i_t, bos, T, i_c, i_h, _gate_cumsum(g, bos, i_t, T, i_h, H, M, BT, BM)


@triton.jit
def _classify(flags, steep, idx, one):
    """Flag entry idx = i_tc * NBH + i_bh steep (1) or not (0); append a steep one to the list
    steep = [count, entries...] (in any order: each chunk is computed on its own)."""
    if one:
        tl.store(flags + idx, 0)
    else:
        tl.store(flags + idx, 1)
        tl.store(steep + 1 + tl.atomic_add(steep, 1), idx)


@triton.jit
def _is_mild(flags, i_tc, i_bh, NBH):
    return tl.load(flags + i_tc * NBH + i_bh) == 0


@triton.jit
def _listed(steep, j, NBH):
    """(i_tc, i_bh) of the j-th steep chunk."""
    e = tl.load(steep + 1 + j)
    return e // NBH, e % NBH


# --------------------------------------------------------------------------------------
# forward: logits, softmax, outputs
# --------------------------------------------------------------------------------------
@triton.jit
def _fwd_o_kernel(
    q, k, v, s, g, hk, hv, o, z, p, flags, steep, cu_seqlens, chunk_indices, scale, T, NBH,
    HQ: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, M: tl.constexpr,
    BT: tl.constexpr, BS: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BM: tl.constexpr,
    BC: tl.constexpr, IS_VARLEN: tl.constexpr, ONE: tl.constexpr,
):
    """ONE: grid (G, chunks, NBH), classifies every chunk and runs the mild ones; else grid
    (G, P), runs the steep ones, P programs striding through the list."""
    i_g = tl.program_id(0)
    G: tl.constexpr = HQ // H
    if ONE:
        i_tc, i_bh = tl.program_id(1), tl.program_id(2)
        i_t, bos, Tn, i_c, i_h, b_b = _locate(g, cu_seqlens, chunk_indices, i_tc, i_bh, T, H, M, BT, BM, IS_VARLEN)
        one = fits_one_anchor(b_b)
        if i_g == 0:
            _classify(flags, steep, i_tc * NBH + i_bh, one)
        if one:
            _fwd_o_chunk(q, k, v, s, hk, hv, o, z, p, b_b, scale, bos, i_t, Tn, i_c, i_h, i_h * G + i_g,
                         HQ, H, K, V, M, BT, BT, BK, BM, BC)
    else:
        for j in range(tl.program_id(1), tl.load(steep), tl.num_programs(1)):
            i_tc, i_bh = _listed(steep, j, NBH)
            i_t, bos, Tn, i_c, i_h, b_b = _locate(g, cu_seqlens, chunk_indices, i_tc, i_bh, T, H, M, BT, BM,
                                                  IS_VARLEN)
            _fwd_o_chunk(q, k, v, s, hk, hv, o, z, p, b_b, scale, bos, i_t, Tn, i_c, i_h, i_h * G + i_g,
                         HQ, H, K, V, M, BT, BS, BK, BM, BC)


@triton.jit
def _fwd_o_chunk(
    q, k, v, s, hk, hv, o, z, p, b_b, scale, bos, i_t, T, i_c, i_h, i_hq,
    HQ: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, M: tl.constexpr,
    BT: tl.constexpr, bs: tl.constexpr, BK: tl.constexpr, BM: tl.constexpr, BC: tl.constexpr,
):
    o_i = tl.arange(0, BT)
    m_causal = o_i[:, None] >= o_i[None, :]
    b_s = _load_rows(s, bos, i_t, T, i_h, H, M, BT, BM).to(tl.float32)
    b_q = _load_rows(q, bos, i_t, T, i_hq, HQ, K, BT, BK)
    b_k = _load_rows(k, bos, i_t, T, i_h, H, K, BT, BK)
    dt = b_k.dtype
    fac = _factors(b_b, b_s, b_k, bs, BT)
    b_qs = (b_q.to(tl.float32) * scale).to(dt)
    p_hk = tl.make_block_ptr(hk + (i_c * H + i_h) * K * M, (K, M), (M, 1), (0, 0), (BK, BM), (1, 0))
    b_K0 = tl.load(p_hk, boundary_check=(0, 1)).to(dt)

    # pass 1: slot logits
    b_z = _dot(b_qs, b_K0) * _decay(fac, bs, BT)
    b_A = tl.where(m_causal, _dot(b_qs, tl.trans(b_k)), 0.).to(dt)
    b_z += _mix(b_A, fac, bs, BT)
    _store_rows(z, b_z, bos, i_t, T, i_hq, HQ, M, BT, BM)
    b_p = _softmax_rows(b_z, M, BM)
    _store_rows(p, b_p, bos, i_t, T, i_hq, HQ, M, BT, BM)

    # pass 2: read the value slots, BC output columns at a time (a smaller live accumulator)
    b_pl = (b_p * _decay(fac, bs, BT)).to(dt)
    b_A2 = tl.where(m_causal, _mix_t(b_p * fac[0], fac, b_k, bs, BT), 0.).to(dt)
    for i_v in range(tl.cdiv(V, BC)):
        p_hv = tl.make_block_ptr(hv + (i_c * H + i_h) * M * V, (M, V), (V, 1), (0, i_v * BC), (BM, BC), (1, 0))
        b_o = _dot(b_pl, tl.load(p_hv, boundary_check=(0, 1)).to(dt))
        b_o += _dot(b_A2, _load_cols(v, bos, i_t, T, i_h, i_v, H, V, BT, BC))
        _store_cols(o, b_o, bos, i_t, T, i_hq, i_v, HQ, V, BT, BC)


# --------------------------------------------------------------------------------------
# backward: dp (gradient of the slot weights through pass 2), per query head
# --------------------------------------------------------------------------------------
@triton.jit
def _bwd_dp_kernel(
    q, k, v, s, g, hk, hv, z, do, dz, r, dq, flags, steep, cu_seqlens, chunk_indices, scale, T, NBH,
    HQ: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, M: tl.constexpr,
    BT: tl.constexpr, BS: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BM: tl.constexpr,
    BC: tl.constexpr, IS_VARLEN: tl.constexpr, ONE: tl.constexpr,
):
    i_g = tl.program_id(0)
    G: tl.constexpr = HQ // H
    if ONE:
        i_tc, i_bh = tl.program_id(1), tl.program_id(2)
        if _is_mild(flags, i_tc, i_bh, NBH):
            i_t, bos, Tn, i_c, i_h, b_b = _locate(g, cu_seqlens, chunk_indices, i_tc, i_bh, T, H, M, BT, BM,
                                                  IS_VARLEN)
            _bwd_dp_chunk(q, k, v, s, hk, hv, z, do, dz, r, dq, b_b, scale, bos, i_t, Tn, i_c, i_h, i_h * G + i_g,
                          HQ, H, K, V, M, BT, BT, BV, BM, BC)
    else:
        for j in range(tl.program_id(1), tl.load(steep), tl.num_programs(1)):
            i_tc, i_bh = _listed(steep, j, NBH)
            i_t, bos, Tn, i_c, i_h, b_b = _locate(g, cu_seqlens, chunk_indices, i_tc, i_bh, T, H, M, BT, BM,
                                                  IS_VARLEN)
            _bwd_dp_chunk(q, k, v, s, hk, hv, z, do, dz, r, dq, b_b, scale, bos, i_t, Tn, i_c, i_h, i_h * G + i_g,
                          HQ, H, K, V, M, BT, BS, BV, BM, BC)


@triton.jit
def _bwd_dp_chunk(
    q, k, v, s, hk, hv, z, do, dz, r, dq, b_b, scale, bos, i_t, T, i_c, i_h, i_hq,
    HQ: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, M: tl.constexpr,
    BT: tl.constexpr, bs: tl.constexpr, BV: tl.constexpr, BM: tl.constexpr, BC: tl.constexpr,
):
    o_i = tl.arange(0, BT)
    m_causal = o_i[:, None] >= o_i[None, :]
    b_s = _load_rows(s, bos, i_t, T, i_h, H, M, BT, BM).to(tl.float32)
    b_v = _load_rows(v, bos, i_t, T, i_h, H, V, BT, BV)
    dt = b_v.dtype
    fac = _factors(b_b, b_s, b_v, bs, BT)
    b_do = _load_rows(do, bos, i_t, T, i_hq, HQ, V, BT, BV).to(dt)
    p_hv = tl.make_block_ptr(hv + (i_c * H + i_h) * M * V, (V, M), (1, V), (0, 0), (BV, BM), (0, 1))
    b_V0t = tl.load(p_hv, boundary_check=(0, 1)).to(dt)
    b_dp = _dot(b_do, b_V0t) * _decay(fac, bs, BT)
    b_dA = tl.where(m_causal, _dot(b_do, tl.trans(b_v)), 0.).to(dt)
    b_dp += _mix(b_dA, fac, bs, BT)
    b_z = _load_rows(z, bos, i_t, T, i_hq, HQ, M, BT, BM)
    b_p = _softmax_rows(b_z, M, BM)
    b_dz = b_p * (b_dp - tl.sum(b_p * b_dp, axis=1)[:, None])
    _store_rows(dz, b_dz, bos, i_t, T, i_hq, HQ, M, BT, BM)
    _store_rows(r, b_z * b_dz + b_p * b_dp, bos, i_t, T, i_hq, HQ, M, BT, BM)

    # dq = scale * [(dz * Lam) @ K0^T + tril(dA1) @ k],  dA1_ij = sum_m dz_i[m] s_j[m] 2^(b_i[m]-b_j[m]),
    # BC columns at a time
    b_dzl = (b_dz * _decay(fac, bs, BT)).to(dt)
    b_dA1 = tl.where(m_causal, _mix_t(b_dz * fac[0], fac, b_v, bs, BT), 0.).to(dt)
    for i_k in range(tl.cdiv(K, BC)):
        p_hk = tl.make_block_ptr(hk + (i_c * H + i_h) * K * M, (K, M), (M, 1), (i_k * BC, 0), (BC, BM), (1, 0))
        b_dq = _dot(b_dzl, tl.trans(tl.load(p_hk, boundary_check=(0, 1)).to(dt)))
        b_dq += _dot(b_dA1, _load_cols(k, bos, i_t, T, i_h, i_k, H, K, BT, BC))
        _store_cols(dq, b_dq * scale, bos, i_t, T, i_hq, i_k, HQ, K, BT, BC)


# --------------------------------------------------------------------------------------
# backward: pass 1 (dq, dk, ds part 1, row terms of the gate gradient)
# --------------------------------------------------------------------------------------
@triton.jit
def _bwd_dqk_kernel(
    q, k, s, g, dz, r, dhk, dk, ds1, dB, flags, steep, cu_seqlens, chunk_indices, scale, T, NBH,
    HQ: tl.constexpr, H: tl.constexpr, K: tl.constexpr, M: tl.constexpr,
    BT: tl.constexpr, BS: tl.constexpr, BK: tl.constexpr, BM: tl.constexpr,
    IS_VARLEN: tl.constexpr, ONE: tl.constexpr,
):
    if ONE:
        i_tc, i_bh = tl.program_id(0), tl.program_id(1)
        if _is_mild(flags, i_tc, i_bh, NBH):
            i_t, bos, Tn, i_c, i_h, b_b = _locate(g, cu_seqlens, chunk_indices, i_tc, i_bh, T, H, M, BT, BM,
                                                  IS_VARLEN)
            _bwd_dqk_chunk(q, k, s, dz, r, dhk, dk, ds1, dB, b_b, scale, bos, i_t, Tn, i_c, i_h,
                           HQ, H, K, M, BT, BT, BK, BM)
    else:
        for j in range(tl.program_id(0), tl.load(steep), tl.num_programs(0)):
            i_tc, i_bh = _listed(steep, j, NBH)
            i_t, bos, Tn, i_c, i_h, b_b = _locate(g, cu_seqlens, chunk_indices, i_tc, i_bh, T, H, M, BT, BM,
                                                  IS_VARLEN)
            _bwd_dqk_chunk(q, k, s, dz, r, dhk, dk, ds1, dB, b_b, scale, bos, i_t, Tn, i_c, i_h,
                           HQ, H, K, M, BT, BS, BK, BM)


@triton.jit
def _bwd_dqk_chunk(
    q, k, s, dz, r, dhk, dk, ds1, dB, b_b, scale, bos, i_t, T, i_c, i_h,
    HQ: tl.constexpr, H: tl.constexpr, K: tl.constexpr, M: tl.constexpr,
    BT: tl.constexpr, bs: tl.constexpr, BK: tl.constexpr, BM: tl.constexpr,
):
    G: tl.constexpr = HQ // H
    o_i = tl.arange(0, BT)
    m_causal_t = o_i[:, None] <= o_i[None, :]      # [j, i]: j <= i
    b_bl = tl.sum(tl.where((o_i == BT - 1)[:, None], b_b, 0.), axis=0)
    b_s = _load_rows(s, bos, i_t, T, i_h, H, M, BT, BM).to(tl.float32)
    b_k = _load_rows(k, bos, i_t, T, i_h, H, K, BT, BK)
    dt = b_k.dtype
    fac = _factors(b_b, b_s, b_k, bs, BT)

    b_dk = tl.zeros([BT, BK], dtype=tl.float32)
    b_ds = tl.zeros([BT, BM], dtype=tl.float32)
    for i_g in range(G):
        i_hq = i_h * G + i_g
        b_q = _load_rows(q, bos, i_t, T, i_hq, HQ, K, BT, BK)
        b_qs = (b_q.to(tl.float32) * scale).to(dt)
        b_dz = _load_rows(dz, bos, i_t, T, i_hq, HQ, M, BT, BM)
        b_At = tl.where(m_causal_t, _dot(b_k, tl.trans(b_qs)), 0.).to(dt)   # A1^T [j, i]
        b_dAt, b_ds = _mix_bwd(b_dz * fac[0], b_At, b_ds, fac, bs, BT)
        b_dAt = tl.where(m_causal_t, b_dAt, 0.).to(dt)
        b_dk += _dot(b_dAt, b_qs)
    b_ds = _mix_bwd_end(b_ds, fac, bs, BT)
    b_gam = _decay_to_end(fac, b_bl, bs, BT)
    p_dh = tl.make_block_ptr(dhk + (i_c * H + i_h) * K * M, (K, M), (M, 1), (0, 0), (BK, BM), (1, 0))
    b_dKn = tl.load(p_dh, boundary_check=(0, 1)).to(dt)
    b_s = _load_rows(s, bos, i_t, T, i_h, H, M, BT, BM).to(tl.float32)   # reloaded: fewer live registers
    b_dk += _dot((b_s * b_gam).to(dt), tl.trans(b_dKn))
    b_ds += b_gam * _dot(b_k, b_dKn)
    _store_rows(dk, b_dk, bos, i_t, T, i_h, H, K, BT, BK)
    _store_rows(ds1, b_ds, bos, i_t, T, i_h, H, M, BT, BM)
    b_dB = -b_s * b_ds
    for i_g in range(G):   # the row terms, summed over the group after the loop above (fewer live registers)
        b_dB += _load_rows(r, bos, i_t, T, i_h * G + i_g, HQ, M, BT, BM)
    _store_rows(dB, b_dB, bos, i_t, T, i_h, H, M, BT, BM)


# --------------------------------------------------------------------------------------
# backward: pass 2 (dv, ds, per-step gate gradient)
# --------------------------------------------------------------------------------------
@triton.jit
def _bwd_dvs_kernel(
    v, s, g, p, do, dhv, dv, ds1, ds, dB, flags, steep, cu_seqlens, chunk_indices, T, NBH,
    HQ: tl.constexpr, H: tl.constexpr, V: tl.constexpr, M: tl.constexpr,
    BT: tl.constexpr, BS: tl.constexpr, BV: tl.constexpr, BM: tl.constexpr,
    IS_VARLEN: tl.constexpr, ONE: tl.constexpr,
):
    if ONE:
        i_tc, i_bh = tl.program_id(0), tl.program_id(1)
        if _is_mild(flags, i_tc, i_bh, NBH):
            i_t, bos, Tn, i_c, i_h, b_b = _locate(g, cu_seqlens, chunk_indices, i_tc, i_bh, T, H, M, BT, BM,
                                                  IS_VARLEN)
            _bwd_dvs_chunk(v, s, p, do, dhv, dv, ds1, ds, dB, b_b, bos, i_t, Tn, i_c, i_h,
                           HQ, H, V, M, BT, BT, BV, BM)
    else:
        for j in range(tl.program_id(0), tl.load(steep), tl.num_programs(0)):
            i_tc, i_bh = _listed(steep, j, NBH)
            i_t, bos, Tn, i_c, i_h, b_b = _locate(g, cu_seqlens, chunk_indices, i_tc, i_bh, T, H, M, BT, BM,
                                                  IS_VARLEN)
            _bwd_dvs_chunk(v, s, p, do, dhv, dv, ds1, ds, dB, b_b, bos, i_t, Tn, i_c, i_h,
                           HQ, H, V, M, BT, BS, BV, BM)


@triton.jit
def _bwd_dvs_chunk(
    v, s, p, do, dhv, dv, ds1, ds, dB, b_b, bos, i_t, T, i_c, i_h,
    HQ: tl.constexpr, H: tl.constexpr, V: tl.constexpr, M: tl.constexpr,
    BT: tl.constexpr, bs: tl.constexpr, BV: tl.constexpr, BM: tl.constexpr,
):
    G: tl.constexpr = HQ // H
    o_i = tl.arange(0, BT)
    m_causal_t = o_i[:, None] <= o_i[None, :]
    b_bl = tl.sum(tl.where((o_i == BT - 1)[:, None], b_b, 0.), axis=0)
    b_s = _load_rows(s, bos, i_t, T, i_h, H, M, BT, BM).to(tl.float32)
    b_v = _load_rows(v, bos, i_t, T, i_h, H, V, BT, BV)
    dt = b_v.dtype
    fac = _factors(b_b, b_s, b_v, bs, BT)

    b_dv = tl.zeros([BT, BV], dtype=tl.float32)
    b_ds = tl.zeros([BT, BM], dtype=tl.float32)
    for i_g in range(G):
        i_hq = i_h * G + i_g
        b_do = _load_rows(do, bos, i_t, T, i_hq, HQ, V, BT, BV).to(dt)
        b_pF = _load_rows(p, bos, i_t, T, i_hq, HQ, M, BT, BM).to(tl.float32) * fac[0]
        b_dAt = tl.where(m_causal_t, _dot(b_v, tl.trans(b_do)), 0.).to(dt)   # dA2^T [j, i]
        b_At, b_ds = _mix_bwd(b_pF, b_dAt, b_ds, fac, bs, BT)
        b_At = tl.where(m_causal_t, b_At, 0.).to(dt)
        b_dv += _dot(b_At, b_do)
    b_ds = _mix_bwd_end(b_ds, fac, bs, BT)
    b_gam = _decay_to_end(fac, b_bl, bs, BT)
    # dV~ and s loaded after the loop: fewer live registers in it
    p_dh = tl.make_block_ptr(dhv + (i_c * H + i_h) * M * V, (M, V), (V, 1), (0, 0), (BM, BV), (1, 0))
    b_dVn = tl.load(p_dh, boundary_check=(0, 1)).to(dt)
    b_s = _load_rows(s, bos, i_t, T, i_h, H, M, BT, BM).to(tl.float32)
    b_dv += _dot((b_s * b_gam).to(dt), b_dVn)
    b_ds += b_gam * _dot(b_v, tl.trans(b_dVn))
    _store_rows(dv, b_dv, bos, i_t, T, i_h, H, V, BT, BV)
    b_ds1 = _load_rows(ds1, bos, i_t, T, i_h, H, M, BT, BM)
    b_dB = _load_rows(dB, bos, i_t, T, i_h, H, M, BT, BM)
    _store_rows(ds, b_ds1 + b_ds, bos, i_t, T, i_h, H, M, BT, BM)
    _store_rows(dB, b_dB - b_s * b_ds, bos, i_t, T, i_h, H, M, BT, BM)
