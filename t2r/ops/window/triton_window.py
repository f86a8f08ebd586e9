"""Sliding-window + sink attention as Triton kernels: `naive.py`'s rule without a block mask, fwd and bwd.

A query reads a band (its own block of BQ queries and the `window - 1` keys before it) and, gathered per query,
its document's first `sinks` tokens that lie outside the band. The two sets never overlap (a sink inside the
window is read in the band), so one online softmax (FlashAttention-2, Dao 2023, alg. 1) over both gives the
rule exactly. Documents are told apart by their positions alone (`back == pos_q - pos_k`), so a packed row of
any number of documents costs the same as one document: no per-document blocks, masks or recompiles.

    forward:  o_t = sum_s p_ts v_s,  p_ts = softmax_s(scale q_t.k_s over visible s),  lse_t kept
    backward: dp_ts = do_t.v_s, ds_ts = p_ts (dp_ts - delta_t), delta_t = do_t.o_t (FlashAttention-2, alg. 2)
              dq_t = scale sum_s ds_ts k_s;  dk_s = scale sum_t ds_ts q_t;  dv_s = sum_t p_ts do_t

Three launches: the forward; dq (with the sink keys' dk/dv added atomically in fp32, since a sink is read by
every query of its document); dk/dv of the band, one program per key block, over the query blocks whose band
reaches it. Work is O(T (window + BQ + sinks)) per head; memory O(T) beyond the inputs (lse, delta).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..triton_utils import next_pow2

BQ = 64
"""Queries per program (and keys per band tile)."""


@triton.jit
def _visible_band(offs_q, offs_k, pos_q, pos_k, real_k, T, WINDOW: tl.constexpr, HAS_REAL: tl.constexpr):
    """[BQ, BK] bool: key s is read in the band by query t (t itself, or a real key of t's document less than
    WINDOW back)."""
    back = offs_q[:, None] - offs_k[None, :]
    vis = (back >= 0) & (back < WINDOW) & (back == pos_q[:, None] - pos_k[None, :])
    if HAS_REAL:
        vis = vis & real_k[None, :]
    vis = vis | (back == 0)
    return vis & (offs_q[:, None] < T) & (offs_k[None, :] < T)


@triton.jit
def _query_block(i_t, i_bh, T, HQ: tl.constexpr, H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                 BQ: tl.constexpr):
    """A program's query block: (query head, its kv head, the row's first stream index, query indices and
    mask, feature indices and mask)."""
    i_b, i_hq = i_bh // HQ, i_bh % HQ
    offs_q = i_t * BQ + tl.arange(0, BQ)
    offs_d = tl.arange(0, BD)
    return i_hq, i_hq // (HQ // H), i_b * T, offs_q, offs_q < T, offs_d, offs_d < D


@triton.jit
def _key_tile(K, V, POS, REAL, row, s0, i_h, offs_d, d_ok, T, H: tl.constexpr, D: tl.constexpr, BQ: tl.constexpr,
              HAS_REAL: tl.constexpr):
    """The BQ keys from stream index s0 of kv head i_h: (indices, their k/v offsets and mask, k, v, positions,
    real flags); keys past T are masked (k = v = 0, position -1)."""
    offs_k = s0 + tl.arange(0, BQ)
    k_ok = offs_k < T
    kv = ((row + offs_k[:, None]) * H + i_h) * D + offs_d[None, :]
    kv_ok = k_ok[:, None] & d_ok[None, :]
    k = tl.load(K + kv, mask=kv_ok, other=0.0)
    v = tl.load(V + kv, mask=kv_ok, other=0.0)
    pos_k = tl.load(POS + row + offs_k, mask=k_ok, other=-1)
    real_k = k_ok
    if HAS_REAL:
        real_k = tl.load(REAL + row + offs_k, mask=k_ok, other=0) != 0
    return offs_k, kv, kv_ok, k, v, pos_k, real_k


@triton.jit
def _sink_index(offs_q, pos_q, POS, REAL, row, m, T, WINDOW: tl.constexpr, HAS_REAL: tl.constexpr):
    """(stream index, visible) of query t's m-th document sink when it lies outside t's band."""
    idx = offs_q - pos_q + m
    ok = (offs_q < T) & (pos_q - m >= WINDOW) & (idx >= 0)
    pos_s = tl.load(POS + row + idx, mask=ok, other=-1)
    ok = ok & (pos_s == m)
    if HAS_REAL:
        ok = ok & (tl.load(REAL + row + idx, mask=ok, other=0) != 0)
    return idx, ok


@triton.jit
def _window_fwd_kernel(Q, K, V, POS, REAL, O, LSE, scale, T,
                       HQ: tl.constexpr, H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                       WINDOW: tl.constexpr, SINKS: tl.constexpr, BQ: tl.constexpr, HAS_REAL: tl.constexpr,
                       PRECISION: tl.constexpr):
    i_t = tl.program_id(0)
    i_hq, i_h, row, offs_q, q_ok, offs_d, d_ok = _query_block(i_t, tl.program_id(1), T, HQ, H, D, BD, BQ)
    q = tl.load(Q + ((row + offs_q[:, None]) * HQ + i_hq) * D + offs_d[None, :], mask=q_ok[:, None] & d_ok[None, :],
                other=0.0)
    pos_q = tl.load(POS + row + offs_q, mask=q_ok, other=0)
    m_i = tl.full([BQ], float("-inf"), tl.float32)
    l_i = tl.zeros([BQ], tl.float32)
    acc = tl.zeros([BQ, BD], tl.float32)
    lo = tl.maximum(i_t * BQ - WINDOW + 1, 0) // BQ * BQ
    for s0 in range(lo, i_t * BQ + BQ, BQ):
        offs_k, kv, kv_ok, k, v, pos_k, real_k = _key_tile(K, V, POS, REAL, row, s0, i_h, offs_d, d_ok, T, H, D, BQ,
                                                           HAS_REAL)
        vis = _visible_band(offs_q, offs_k, pos_q, pos_k, real_k, T, WINDOW, HAS_REAL)
        s = tl.where(vis, tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that have seen nothing yet
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    for m in tl.static_range(SINKS):
        idx, ok = _sink_index(offs_q, pos_q, POS, REAL, row, m, T, WINDOW, HAS_REAL)
        kv = ((row + idx[:, None]) * H + i_h) * D + offs_d[None, :]
        k = tl.load(K + kv, mask=ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        v = tl.load(V + kv, mask=ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        s = tl.where(ok, tl.sum(q.to(tl.float32) * k, 1) * scale, float("-inf"))
        m_new = tl.maximum(m_i, s)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe)
        l_i = l_i * alpha + p
        acc = acc * alpha[:, None] + p[:, None] * v
        m_i = m_new
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    out = ((row + offs_q[:, None]) * HQ + i_hq) * D + offs_d[None, :]
    tl.store(O + out, (acc / l_safe[:, None]).to(O.dtype.element_ty), mask=q_ok[:, None] & d_ok[None, :])
    tl.store(LSE + (row + offs_q) * HQ + i_hq, m_i + tl.log(l_safe), mask=q_ok)


@triton.jit
def _window_dq_kernel(Q, K, V, POS, REAL, DO, LSE, DELTA, DQ, DK_SINK, DV_SINK, scale, T,
                      HQ: tl.constexpr, H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                      WINDOW: tl.constexpr, SINKS: tl.constexpr, BQ: tl.constexpr, HAS_REAL: tl.constexpr,
                      PRECISION: tl.constexpr):
    i_t = tl.program_id(0)
    i_hq, i_h, row, offs_q, q_ok, offs_d, d_ok = _query_block(i_t, tl.program_id(1), T, HQ, H, D, BD, BQ)
    qo = ((row + offs_q[:, None]) * HQ + i_hq) * D + offs_d[None, :]
    q = tl.load(Q + qo, mask=q_ok[:, None] & d_ok[None, :], other=0.0)
    do = tl.load(DO + qo, mask=q_ok[:, None] & d_ok[None, :], other=0.0)
    pos_q = tl.load(POS + row + offs_q, mask=q_ok, other=0)
    lse = tl.load(LSE + (row + offs_q) * HQ + i_hq, mask=q_ok, other=0.0)
    delta = tl.load(DELTA + (row + offs_q) * HQ + i_hq, mask=q_ok, other=0.0)
    dq = tl.zeros([BQ, BD], tl.float32)
    lo = tl.maximum(i_t * BQ - WINDOW + 1, 0) // BQ * BQ
    for s0 in range(lo, i_t * BQ + BQ, BQ):
        offs_k, kv, kv_ok, k, v, pos_k, real_k = _key_tile(K, V, POS, REAL, row, s0, i_h, offs_d, d_ok, T, H, D, BQ,
                                                           HAS_REAL)
        vis = _visible_band(offs_q, offs_k, pos_q, pos_k, real_k, T, WINDOW, HAS_REAL)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        p = tl.where(vis, tl.exp(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    for m in tl.static_range(SINKS):
        idx, ok = _sink_index(offs_q, pos_q, POS, REAL, row, m, T, WINDOW, HAS_REAL)
        kv = ((row + idx[:, None]) * H + i_h) * D + offs_d[None, :]
        kv_ok = ok[:, None] & d_ok[None, :]
        k = tl.load(K + kv, mask=kv_ok, other=0.0).to(tl.float32)
        v = tl.load(V + kv, mask=kv_ok, other=0.0).to(tl.float32)
        s = tl.sum(q.to(tl.float32) * k, 1) * scale
        p = tl.where(ok, tl.exp(s - lse), 0.0)
        ds = p * (tl.sum(do.to(tl.float32) * v, 1) - delta)
        dq += ds[:, None] * k
        # a sink is read by every query of its document: its key and value gradients are summed across programs
        tl.atomic_add(DK_SINK + kv, ds[:, None] * q.to(tl.float32) * scale, mask=kv_ok, sem="relaxed")
        tl.atomic_add(DV_SINK + kv, p[:, None] * do.to(tl.float32), mask=kv_ok, sem="relaxed")
    tl.store(DQ + qo, (dq * scale).to(DQ.dtype.element_ty), mask=q_ok[:, None] & d_ok[None, :])


@triton.jit
def _window_dkv_kernel(Q, K, V, POS, REAL, DO, LSE, DELTA, DK, DV, DK_SINK, DV_SINK, scale, T,
                       HQ: tl.constexpr, H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                       WINDOW: tl.constexpr, BQ: tl.constexpr, HAS_REAL: tl.constexpr, HAS_SINKS: tl.constexpr,
                       PRECISION: tl.constexpr):
    i_s, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    group = HQ // H
    row = i_b * T
    offs_d = tl.arange(0, BD)
    d_ok = offs_d < D
    offs_k, kv, kv_ok, k, v, pos_k, real_k = _key_tile(K, V, POS, REAL, row, i_s * BQ, i_h, offs_d, d_ok, T, H, D, BQ,
                                                       HAS_REAL)
    dk = tl.zeros([BQ, BD], tl.float32)
    dv = tl.zeros([BQ, BD], tl.float32)
    hi = tl.minimum(i_s * BQ + BQ + WINDOW - 1, T)  # the last query whose band reaches this block, + 1
    for i_g in range(group):
        i_hq = i_h * group + i_g
        for t0 in range(i_s * BQ, hi, BQ):
            offs_q = t0 + tl.arange(0, BQ)
            q_ok = offs_q < T
            qo = ((row + offs_q[:, None]) * HQ + i_hq) * D + offs_d[None, :]
            q = tl.load(Q + qo, mask=q_ok[:, None] & d_ok[None, :], other=0.0)
            do = tl.load(DO + qo, mask=q_ok[:, None] & d_ok[None, :], other=0.0)
            pos_q = tl.load(POS + row + offs_q, mask=q_ok, other=0)
            lse = tl.load(LSE + (row + offs_q) * HQ + i_hq, mask=q_ok, other=0.0)
            delta = tl.load(DELTA + (row + offs_q) * HQ + i_hq, mask=q_ok, other=0.0)
            vis = _visible_band(offs_q, offs_k, pos_q, pos_k, real_k, T, WINDOW, HAS_REAL)  # [BQ (q), BQ (k)]
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
            p = tl.where(vis, tl.exp(s - lse[:, None]), 0.0)
            dv += tl.dot(tl.trans(p).to(do.dtype), do, input_precision=PRECISION)
            dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
            ds = p * (dp - delta[:, None])
            dk += tl.dot(tl.trans(ds).to(q.dtype), q, input_precision=PRECISION)
    dk = dk * scale
    if HAS_SINKS:
        dk += tl.load(DK_SINK + kv, mask=kv_ok, other=0.0)
        dv += tl.load(DV_SINK + kv, mask=kv_ok, other=0.0)
    tl.store(DK + kv, dk.to(DK.dtype.element_ty), mask=kv_ok)
    tl.store(DV + kv, dv.to(DV.dtype.element_ty), mask=kv_ok)


def _meta(q, k, window, sinks, real):
    B, T, HQ, D = q.shape
    precision = "ieee" if q.dtype == torch.float32 else "tf32"  # fp32 inputs stay exact; half dots ignore it
    return dict(HQ=HQ, H=k.shape[2], D=D, BD=max(16, next_pow2(D)), WINDOW=int(window), BQ=BQ,
                HAS_REAL=real is not None, PRECISION=precision), (triton.cdiv(T, BQ), B * HQ)


def window_forward(q, k, v, positions, real, window: int, sinks: int, scale: float):
    """(o `[B,T,HQ,D]`, lse `[B,T,HQ]` fp32) for contiguous q, k, v, int32 positions `[B,T]`, int8 real or None."""
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    meta, grid = _meta(q, k, window, sinks, real)
    _window_fwd_kernel[grid](q, k, v, positions, real if real is not None else positions, o, lse, scale,
                             q.shape[1], SINKS=int(sinks), **meta)
    return o, lse


def window_backward(q, k, v, positions, real, o, lse, do, window: int, sinks: int, scale: float):
    """(dq, dk, dv) of `window_forward` for the output gradient `do`."""
    delta = (o.float() * do.float()).sum(-1)
    dq = torch.empty_like(q)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    sink_grads = [torch.zeros(k.shape, dtype=torch.float32, device=k.device) for _ in range(2)] if sinks else [dk, dv]
    meta, grid = _meta(q, k, window, sinks, real)
    real_ = real if real is not None else positions
    _window_dq_kernel[grid](q, k, v, positions, real_, do, lse, delta, dq, *sink_grads, scale, q.shape[1],
                            SINKS=int(sinks), **meta)
    grid_kv = (triton.cdiv(q.shape[1], BQ), q.shape[0] * k.shape[2])
    _window_dkv_kernel[grid_kv](q, k, v, positions, real_, do, lse, delta, dk, dv, *sink_grads, scale, q.shape[1],
                                HAS_SINKS=bool(sinks), **meta)
    return dq, dk, dv


@torch.library.custom_op("t2r::window_attention", mutates_args=())
def _window_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
               real: torch.Tensor | None, window: int, sinks: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return window_forward(q, k, v, positions, real, window, sinks, scale)


@_window_op.register_fake
def _(q, k, v, positions, real, window, sinks, scale):
    return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("t2r::window_attention_backward", mutates_args=())
def _window_backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                        real: torch.Tensor | None, o: torch.Tensor, lse: torch.Tensor, do: torch.Tensor, window: int,
                        sinks: int, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return window_backward(q, k, v, positions, real, o, lse, do.contiguous(), window, sinks, scale)


@_window_backward_op.register_fake
def _(q, k, v, positions, real, o, lse, do, window, sinks, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup(ctx, inputs, output):
    q, k, v, positions, real, window, sinks, scale = inputs
    ctx.save_for_backward(q, k, v, positions, real, *output)
    ctx.meta = window, sinks, scale


def _backward(ctx, do, dlse):
    q, k, v, positions, real, o, lse = ctx.saved_tensors
    dq, dk, dv = _window_backward_op(q, k, v, positions, real, o, lse, do, *ctx.meta)
    return dq, dk, dv, None, None, None, None, None


_window_op.register_autograd(_backward, setup_context=_setup)


def triton_window_attention(q, k, v, *, positions, real=None, window: int, sinks: int, scale: float) -> torch.Tensor:
    """Same arguments and result as `naive_window_attention`; q `[B,T,HQ,D]`, k/v `[B,T,H,D]` (one dtype)."""
    batch, length = q.shape[:2]
    positions = positions.expand(batch, length).to(torch.int32).contiguous()
    real = real.to(torch.int8).contiguous() if real is not None else None
    q, k, v = (t.contiguous() for t in (q, k, v))
    return _window_op(q, k, v, positions, real, int(window), int(sinks), float(scale))[0]
