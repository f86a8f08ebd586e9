"""Triton chunkwise kernels for the gated delta rule (forward and backward), chunk size BT = 64.

Algorithm: the chunkwise WY form of `chunk.py` (DeltaNet's parallel algorithm, arXiv 2406.06484, with
Gated DeltaNet's decay, arXiv 2412.06464). Kernels, one launch each:
  fwd:  _wy_inverse_kernel (triton_solve.py) per chunk: gate cumsum b, X = (I + A)^-1 (16-step blocks)
        _wy_fwd_kernel   (triton_wy.py)   per chunk: W, U'
        _fwd_h_kernel    (triton_scan.py) per sequence: states entering every chunk, new values U, final state
        _fwd_o_kernel    (triton_intra.py) per chunk and query head: outputs
  bwd:  _bwd_dh_kernel   (triton_scan.py) reverse per sequence: dU, gradients of the states leaving every chunk
        _wy_bwd_kernel   (triton_wy.py)   per chunk: dv, dbeta, the W / U' parts of dk and of the gate gradient
        _bwd_dqk_kernel  (triton_intra.py) per chunk: dq, dk, dg (a reverse cumsum inside the chunk)

GQA: k, v, g, beta and the states live on the H kv heads; the kernels that sum over a group (the dh scan,
dk) loop over its query heads; nothing is repeated in memory. States are fp32 in registers; the per-chunk
states kept for the backward are stored in k's dtype (as the GLA kernels do), the final state in fp32.
Head dims up to K = 128 (one K tile); V is tiled.

Compile time: launch configs are pinned (no autotuning: the first call compiles each kernel once); no kernel
is specialised on the length T (do_not_specialize), which Triton would otherwise compile apart for
T % 16 == 0 and make a compile-time constant when T == 1 (a binary with the scan loops folded away: T = 1 was
the one GPU test shape that faulted; now it runs the binary T = 37 runs); the loops over a GQA group are
runtime loops, not unrolled, and the WY inverse works on 16-step blocks (the 64x64 block doubling it replaces
took 222 of the 260 s an offline sm_90 compile of the kernels at K = V = 128, G = 4 took on a loaded 2-core
CPU). Triton 3.6 on Hopper
miscompiles tl.trans of an accumulator fed to a dot (fla #640): no kernel here uses tl.trans; transposed
operands are loaded through transposed block pointers.
"""

import torch
import triton

from ..triton_utils import next_pow2, prepare_chunks
from .triton_intra import _bwd_dqk_kernel, _fwd_o_kernel
from .triton_scan import _bwd_dh_kernel, _fwd_h_kernel
from .triton_solve import _wy_inverse_kernel
from .triton_wy import _wy_bwd_kernel, _wy_fwd_kernel

__all__ = ["chunk_gated_delta_rule_triton", "CONFIGS", "MAX_HEAD_DIM_K"]

BT = 64
MAX_HEAD_DIM_K = 128
# kernel -> (num_warps, num_stages); the GPU tests gradient-check what is shipped here.
CONFIGS = {
    "wy_inverse": (4, 1),
    "wy_fwd": (4, 1),
    "fwd_h": (4, 2),
    "fwd_o": (4, 2),
    "bwd_dh": (4, 2),
    "wy_bwd": (4, 1),
    "bwd_dqk": (8, 1),
}


def _cfg(name):
    w, s = CONFIGS[name]
    return dict(num_warps=w, num_stages=s)


def _blocks(q, V):
    """(BK, BV of the scans, BV of the per-chunk kernels): K in one tile; fp32 tiles half the size."""
    BK = max(16, next_pow2(q.shape[-1]))
    BV_scan = min(32, max(16, next_pow2(V)))
    BV = min(64 if q.element_size() == 2 else 32, max(16, next_pow2(V)))
    return BK, BV_scan, BV


def _states(k, v, g, beta, h0, cu_seqlens, chunks):
    """Everything the output and the backward need: (bcum, ainv, w, h, u, ht)."""
    B, T, H, K = k.shape
    V = v.shape[-1]
    N, NT, chunk_indices, chunk_offsets = chunks
    NTg = NT if cu_seqlens is not None else triton.cdiv(T, BT)
    BK, BVs, BV = _blocks(k, V)
    varlen = cu_seqlens is not None
    bcum = torch.empty(B, T, H, dtype=torch.float32, device=k.device)
    ainv = torch.empty(B, T, H, BT, dtype=torch.float32, device=k.device)
    w = torch.empty_like(k)
    u_part = torch.empty_like(v)
    _wy_inverse_kernel[(NTg, B * H)](
        k, g, beta, bcum, ainv, cu_seqlens, chunk_indices, T,
        H=H, K=K, BT=BT, BK=BK, IS_VARLEN=varlen, **_cfg("wy_inverse"))
    _wy_fwd_kernel[(NTg, B * H)](
        k, v, beta, bcum, ainv, w, u_part, cu_seqlens, chunk_indices, T,
        H=H, K=K, V=V, BT=BT, BK=BK, BV=BV, IS_VARLEN=varlen, **_cfg("wy_fwd"))
    h = torch.empty(NT, H, K, V, dtype=k.dtype, device=k.device)
    u = torch.empty_like(v)
    ht = torch.empty(N, H, K, V, dtype=torch.float32, device=k.device)
    _fwd_h_kernel[(triton.cdiv(V, BVs), N * H)](
        k, w, u_part, bcum, h, u, h0, ht, cu_seqlens, chunk_offsets, T,
        H=H, K=K, V=V, BT=BT, BK=BK, BV=BVs, USE_H0=h0 is not None, IS_VARLEN=varlen, **_cfg("fwd_h"))
    return bcum, ainv, w, h, u, ht


def _fwd(q, k, v, g, beta, scale, h0, cu_seqlens):
    B, T, HQ, K = q.shape
    H, V = v.shape[2], v.shape[3]
    chunks = prepare_chunks(B, T, BT, cu_seqlens)
    NTg = chunks[1] if cu_seqlens is not None else triton.cdiv(T, BT)
    bcum, ainv, w, h, u, ht = _states(k, v, g, beta, h0, cu_seqlens, chunks)
    BK, _, BV = _blocks(q, V)
    o = torch.empty(B, T, HQ, V, dtype=v.dtype, device=v.device)
    _fwd_o_kernel[(triton.cdiv(V, BV), NTg, B * HQ)](
        q, k, u, bcum, h, o, cu_seqlens, chunks[2], scale, T,
        HQ=HQ, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV, IS_VARLEN=cu_seqlens is not None, **_cfg("fwd_o"))
    return o, (bcum, ainv, w, h, u), ht


def _bwd(q, k, v, beta, saved, do, dht, scale, h0, cu_seqlens, g_dtype):
    B, T, HQ, K = q.shape
    H, V = v.shape[2], v.shape[3]
    bcum, ainv, w, h, u = saved
    N, NT, chunk_indices, chunk_offsets = prepare_chunks(B, T, BT, cu_seqlens)
    NTg = NT if cu_seqlens is not None else triton.cdiv(T, BT)
    varlen = cu_seqlens is not None
    BK, BVs, BV = _blocks(q, V)
    dh = torch.empty(NT, H, K, V, dtype=k.dtype, device=k.device)
    du = torch.empty(B, T, H, V, dtype=torch.float32, device=k.device)
    dh0 = torch.empty(N, H, K, V, dtype=torch.float32, device=k.device) if h0 is not None else None
    _bwd_dh_kernel[(triton.cdiv(V, BVs), N * H)](
        q, k, w, bcum, do, dh, du, dht, dh0, cu_seqlens, chunk_offsets, scale, T,
        HQ=HQ, H=H, K=K, V=V, BT=BT, BK=BK, BV=BVs, USE_DHT=dht is not None, STORE_DH0=h0 is not None,
        IS_VARLEN=varlen, **_cfg("bwd_dh"))

    dv = torch.empty_like(v)
    dbeta = torch.empty_like(beta)
    dk_part = torch.empty(B, T, H, K, dtype=torch.float32, device=k.device)
    db_part = torch.empty(B, T, H, dtype=torch.float32, device=k.device)
    dgram = torch.empty(B, T, H, BT, dtype=torch.float32, device=k.device)
    _wy_bwd_kernel[(NTg, B * H)](
        k, v, beta, bcum, ainv, h, du, dv, dk_part, dbeta, db_part, dgram, cu_seqlens, chunk_indices, T,
        H=H, K=K, V=V, BT=BT, BK=BK, BV=BV, IS_VARLEN=varlen, **_cfg("wy_bwd"))

    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dg = torch.empty(B, T, H, dtype=g_dtype, device=k.device)
    _bwd_dqk_kernel[(NTg, B * H)](
        q, k, u, bcum, h, do, dh, dgram, dk_part, db_part, dq, dk, dg, cu_seqlens, chunk_indices, scale, T,
        HQ=HQ, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV, IS_VARLEN=varlen, **_cfg("bwd_dqk"))
    return dq, dk, dv, dg, dbeta, dh0


class _ChunkGatedDeltaFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, scale, initial_state, cu_seqlens):
        h0 = initial_state.float().contiguous() if initial_state is not None else None
        o, saved, ht = _fwd(q, k, v, g, beta, scale, h0, cu_seqlens)
        ctx.save_for_backward(q, k, v, beta, h0, cu_seqlens, *saved)
        ctx.meta = (scale, g.dtype, initial_state.dtype if initial_state is not None else None)
        ctx.set_materialize_grads(False)
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, beta, h0, cu_seqlens, *saved = ctx.saved_tensors
        scale, g_dtype, h0_dtype = ctx.meta
        if do is None:
            do = torch.zeros(q.shape[:3] + (v.shape[-1],), dtype=v.dtype, device=v.device)
        dht = dht.float().contiguous() if dht is not None else None
        dq, dk, dv, dg, dbeta, dh0 = _bwd(q, k, v, beta, saved, do.contiguous(), dht, scale, h0, cu_seqlens,
                                          g_dtype)
        return dq, dk, dv, dg, dbeta, None, (dh0.to(h0_dtype) if dh0 is not None else None), None


# Under torch.compile the kernels run as two custom ops (forward, backward), so a compiled layer keeps one
# graph around them; the backward op recomputes the chunk states (W, U, states) from the inputs.
@torch.library.custom_op("t2r::chunk_gated_delta", mutates_args=())
def _chunk_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
              h0: torch.Tensor | None, cu_seqlens: torch.Tensor | None,
              scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    o, _, ht = _fwd(q, k, v, g, beta, scale, h0, cu_seqlens)
    return o, ht


@_chunk_op.register_fake
def _(q, k, v, g, beta, h0, cu_seqlens, scale):
    B, T, HQ, K = q.shape
    H, V = v.shape[2], v.shape[3]
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    return v.new_empty(B, T, HQ, V), v.new_empty(N, H, K, V, dtype=torch.float32)


@torch.library.custom_op("t2r::chunk_gated_delta_backward", mutates_args=())
def _chunk_backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                       h0: torch.Tensor | None, cu_seqlens: torch.Tensor | None, do: torch.Tensor,
                       dht: torch.Tensor, scale: float
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    B, T = q.shape[:2]
    saved = _states(k, v, g, beta, h0, cu_seqlens, prepare_chunks(B, T, BT, cu_seqlens))[:5]
    dq, dk, dv, dg, dbeta, dh0 = _bwd(q, k, v, beta, saved, do.contiguous(), dht.float().contiguous(), scale, h0,
                                      cu_seqlens, g.dtype)
    return dq, dk, dv, dg, dbeta, (dh0 if dh0 is not None else dht.new_empty(0))


@_chunk_backward_op.register_fake
def _(q, k, v, g, beta, h0, cu_seqlens, do, dht, scale):
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), g.new_empty(g.shape),
            beta.new_empty(beta.shape), dht.new_empty(dht.shape) if h0 is not None else dht.new_empty(0))


def _chunk_op_setup(ctx, inputs, output):
    q, k, v, g, beta, h0, cu_seqlens, scale = inputs
    ctx.save_for_backward(q, k, v, g, beta, h0, cu_seqlens)
    ctx.scale = scale


def _chunk_op_backward(ctx, do, dht):
    q, k, v, g, beta, h0, cu_seqlens = ctx.saved_tensors
    dq, dk, dv, dg, dbeta, dh0 = _chunk_backward_op(q, k, v, g, beta, h0, cu_seqlens, do, dht, ctx.scale)
    return dq, dk, dv, dg, dbeta, (dh0 if h0 is not None else None), None, None


_chunk_op.register_autograd(_chunk_op_backward, setup_context=_chunk_op_setup)


def chunk_gated_delta_rule_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated delta rule with the Triton chunkwise kernels (forward and backward).

    q [B,T,HQ,K], k [B,T,H,K], v [B,T,H,V], g / beta [B,T,H], initial_state [N,H,K,V]; K <= 128.
    Returns (o [B,T,HQ,V] in v's dtype, final state [N,H,K,V] fp32 or None). Same semantics as
    ``t2r.ops.gated_delta.naive.naive_recurrent_gated_delta_rule`` (plus cu_seqlens).
    """
    B, T, HQ, K = q.shape
    H = k.shape[2]
    assert HQ % H == 0, "HQ must be a multiple of H"
    assert K <= MAX_HEAD_DIM_K, f"the gated delta kernels hold K in one tile: K <= {MAX_HEAD_DIM_K}, got {K}"
    if cu_seqlens is not None:
        assert B == 1, "cu_seqlens needs B == 1"
        cu_seqlens = cu_seqlens.to(torch.int32).contiguous()
    scale = K ** -0.5 if scale is None else float(scale)
    out_dtype = v.dtype
    if q.dtype == torch.float16:   # the decays and the WY inverse are safer in bf16's range
        q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    q, k, v, g, beta = (t.contiguous() for t in (q, k, v, g, beta))
    if torch.compiler.is_compiling():
        h0 = initial_state.float().contiguous() if initial_state is not None else None
        o, ht = _chunk_op(q, k, v, g, beta, h0, cu_seqlens, scale)
    else:
        o, ht = _ChunkGatedDeltaFunction.apply(q, k, v, g, beta, scale, initial_state, cu_seqlens)
    return o.to(out_dtype), (ht if output_final_state else None)
