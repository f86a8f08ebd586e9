"""Forgetting attention in Triton: a FlashAttention-2 style forward and backward.

Semantics (those of ``t2r.ops.fox.naive.naive_forgetting_attention``)::

    c_j      = sum_{t <= j} g_t                       (fp32 cumulative log forget gate)
    s_ij     = scale * q_i . k_j + c_{p_i} - c_j       p_i = Tk - Tq + i (bottom-right causal)
    o_i      = sum_{j <= p_i} softmax_j(s_ij) v_j

Shapes: q ``[B, Tq, HQ, K]``, k ``[B, Tk, H, K]``, v ``[B, Tk, H, V]``, g ``[B, Tk, HQ]``
(log forget gates, <= 0, one per query head).  GQA: query head ``i`` reads kv head
``i // (HQ // H)``; k and v are never repeated in memory.

Kernels (triton_fwd.py, triton_bwd.py; all work in log2 units: ``c2 = c * log2(e)``, ``exp2`` everywhere):

* ``_fwd_kernel``: one program per (query block, batch*query head), heaviest
  blocks first.  (Launching the heaviest blocks of all heads first instead measured the same
  here, and made the dq kernel 12% slower: adjacent programs of one head share k and v in L2.)  Key blocks below
  the diagonal run without masks, the diagonal blocks with the causal mask.  Writes ``o`` and the row
  log-sum-exp (log2).
* ``_delta_kernel``: ``delta_i = do_i . o_i`` (fp32).
* ``_bwd_dkv_kernel``: one program per (batch*kv head, key block); heads vary fastest
  in the launch order, so the first key blocks (the most query rows) of all heads start
  first and the light ones fill the tail (6% faster than one head after another on an
  H100).  It loops over the ``G = HQ // H`` query heads of the group and accumulates dk and dv for all
  of them in registers (fp32), so no per-query-head buffers exist.  It also
  writes ``dc_j = -sum_i dS_ij`` per query head (the gradient of the key-side
  bias), which is free there: a reduction of the ``dS^T`` tile along its rows.
* ``_bwd_dq_kernel``: one program per (query block, batch*query head), as the forward.

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
from triton.tools.tensor_descriptor import TensorDescriptor

from .triton_bwd import _bwd_dkv_kernel, _bwd_dq_kernel, _delta_kernel
from .triton_fwd import _fwd_kernel

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
    LAST_KERNEL["dkv"] = _bwd_dkv_kernel[(B * H, triton.cdiv(Tk, BN))](
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


# Under torch.compile the same kernels run as two custom ops (forward, backward), so the graph stays whole
# around them; the backward recomputes the gate cumsums and document bounds (cheap PyTorch ops).
@torch.library.custom_op("t2r::forgetting_attention", mutates_args=())
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                  cu_seqlens: torch.Tensor | None, attention_mask: torch.Tensor | None,
                  scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    cq, ck = _prep_c(g, attention_mask)
    seg_start = _seg_bounds(cu_seqlens, q.shape[1])[0] if cu_seqlens is not None else None
    return _fwd(q, k, v, cq, ck, scale, seg_start)


@_attention_op.register_fake
def _(q, k, v, g, cu_seqlens, attention_mask, scale):
    B, Tq, HQ, _ = q.shape
    return q.new_empty(B, Tq, HQ, v.shape[-1]), q.new_empty(B, HQ, Tq, dtype=torch.float32)


@torch.library.custom_op("t2r::forgetting_attention_backward", mutates_args=())
def _attention_backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                           cu_seqlens: torch.Tensor | None, attention_mask: torch.Tensor | None,
                           o: torch.Tensor, rowb: torch.Tensor, do: torch.Tensor,
                           scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    _, ck = _prep_c(g, attention_mask)
    seg_start = seg_end = None
    if cu_seqlens is not None:
        seg_start, seg_end = _seg_bounds(cu_seqlens, q.shape[1])
    dq, dk, dv, dg = _bwd(_last_contig(do), q, k, v, o, ck, rowb, scale, seg_start, seg_end)
    return dq.contiguous(), dk.contiguous(), dv.contiguous(), dg.to(g.dtype).contiguous()


@_attention_backward_op.register_fake
def _(q, k, v, g, cu_seqlens, attention_mask, o, rowb, do, scale):
    return tuple(t.new_empty(t.shape) for t in (q, k, v, g))


def _attention_op_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:6], *output)
    ctx.scale = inputs[6]
    ctx.mark_non_differentiable(output[1])


def _attention_op_backward(ctx, do, _):
    q, k, v, g, cu_seqlens, attention_mask, o, rowb = ctx.saved_tensors
    return (*_attention_backward_op(q, k, v, g, cu_seqlens, attention_mask, o, rowb, do, ctx.scale),
            None, None, None)


_attention_op.register_autograd(_attention_op_backward, setup_context=_attention_op_setup)


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
    only in Triton's CPU interpreter, for tests).  g may be any float dtype.  Returns ``o`` ``[B, Tq, HQ, V]`` in
    q's dtype.
    """
    if not supports(q, k, v, g, cu_seqlens, attention_mask):
        raise ValueError(
            "parallel_forgetting_attention_triton: unsupported call "
            f"(q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, g {tuple(g.shape)}, "
            f"dtype {q.dtype}, cu_seqlens {cu_seqlens is not None}, attention_mask {attention_mask is not None})"
        )
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if torch.compiler.is_compiling():
        return _attention_op(q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), cu_seqlens,
                             attention_mask, float(scale))[0]
    return ForgettingAttentionFunction.apply(q, k, v, g, float(scale), cu_seqlens, attention_mask)
