"""Triton chunkwise kernels shared by GLA (per-key-channel decay) and simple GLA (scalar decay).

Algorithm (GLA paper, section 4, chunk size BT = 64), per kv head and chunk c with the
gate cumsum b inside the chunk (log2 space) and the state h_c entering the chunk:

    o      = scale * [ (q * 2^b) @ h_c  +  tril(A) @ v ],   A_ij = sum_k q_ik k_jk 2^(b_ik - b_jk)
    h_c+1  = 2^b_last * h_c + (k * 2^(b_last - b))^T @ v

Kernels (one launch each; the scans in triton_scan.py, the per-chunk kernels in triton_intra.py,
their shared pieces in triton_decay.py, the host side here):
  fwd:  _fwd_h   states h_c of every chunk (sequential over chunks; long sequences in parallel
                 segments, see triton_utils.segment_of_sequence), final state (fp32)
        _fwd_o   outputs, fully parallel over (V-block, chunk, query head)
  bwd:  _bwd_dh  dh_c = gradient of the state leaving chunk c (reverse, GQA group summed)
        _bwd_dv  dv, per (V-block, chunk, kv head), loops over the query-head group
        _bwd_dqk dq (per query head), dk and dG = sum_g q*dq - k*dk, per (K-block, chunk, kv head)
        reverse_cumsum  dg_t = sum_{s>=t} dG_s + <dh_T, h_T>   (t2r/ops/triton_utils.py)

GQA: states live on kv heads; the query heads of a group are looped over inside the
CTA wherever a result is summed over the group (dh, dv, dk, dg); k/v are never repeated.

Per-channel decay (GLA) inside a chunk: A is built on tensor cores by splitting each decay
factor at an anchor row a: 2^(b_i - b_j) = 2^(b_i - b_a) * 2^(b_a - b_j).
  * One anchor (the chunk's middle row) when the gate cumsum of the chunk spreads over at most
    2^100 (log-gate sum over the 64 steps >= -69 nats, e.g. -1 nat per step): then
        A = (q * 2^(b - b_a)) @ (k * 2^(b_a - b))^T
    is one product, with every factor inside fp32 range. Trained GLA gates (logsigmoid / 16)
    always take this path.
  * Otherwise one anchor per BS-row sub-block s (its middle row), over keys j <= end of s:
        A[rows of s] = (q * 2^(b - b_a)) @ (k * 2^(b_a - b))^T,
    so each factor spans at most BS/2 steps. Exact while no channel decays by more than
    ~87 nats over BS/2 = 8 consecutive steps (mean log-gate >= -10 per step); beyond that the
    factors are clamped (finite, but the diagonal entries lose accuracy).
The choice is made per chunk (and K-block) inside the kernel. Scalar decay (simple GLA) uses
the exact BT x BT decay matrix.

The transposed products that backward needs (A^T, dA^T) are computed as their own dots
from loaded operands instead of tl.trans of an accumulator: Triton 3.6 miscompiles
tl.trans(acc) fed into tl.dot on Hopper at some block sizes (fla issue #640).
"""

import torch
import triton

from ..triton_utils import next_pow2, num_segments, prepare_chunks, reverse_cumsum, scan_passes
from .triton_intra import _bwd_dqk_kernel, _bwd_dv_kernel, _fwd_o_kernel
from .triton_scan import _bwd_dh_kernel, _fwd_h_kernel

__all__ = ["chunk_linear_attn_triton", "CONFIGS"]

BT_DEFAULT = 64

# Pinned launch configs: kernel -> (num_warps, num_stages). The benchmark may override
# these to sweep; the GPU tests gradient-check whatever is shipped here.
CONFIGS = {
    "fwd_h": (4, 3),
    "fwd_o": (4, 2),
    "bwd_dh": (4, 3),
    "bwd_dv": (4, 2),
    "bwd_dqk": (8, 1),
}
# Block size along K of the dq/dk kernel for per-channel gates (scalar gates use all of K).
DQK_BK = {"gla": 64}   # 128 spills registers: 5.7 vs 4.0 ms fwd+bwd at the Mistral shape


def _cfg(name):
    w, s = CONFIGS[name]
    return dict(num_warps=w, num_stages=s)


# --------------------------------------------------------------------------------------
# host side
# --------------------------------------------------------------------------------------
def _blocks(K: int, V: int):
    BK = min(64, max(16, next_pow2(K)))
    BV = min(64, max(16, next_pow2(V)))
    return BK, BV


def _segment_buffers(n: int, K: int, V: int, device):
    """End states [n, K, V] and total log2 decays [n, K] of the segments of a segmented scan."""
    return (torch.empty(n, K, V, dtype=torch.float32, device=device),
            torch.empty(n, K, dtype=torch.float32, device=device))


def _states(k, v, g, h0, cu_seqlens, scalar, BT, chunks=None):
    """(h, ht): the state entering every chunk and the final state (`_fwd_h_kernel`). `chunks`: what
    `prepare_chunks` gives for these sizes, if the caller has it (with cu_seqlens it reads the device)."""
    B, T, H, K = k.shape
    V = v.shape[3]
    N, NT, _, chunk_offsets = chunks or prepare_chunks(B, T, BT, cu_seqlens)
    BK, BV = _blocks(K, V)
    h = torch.empty(NT, H, K, V, dtype=k.dtype, device=k.device)
    ht = torch.empty(N, H, K, V, dtype=torch.float32, device=k.device)
    tiles = triton.cdiv(K, BK) * triton.cdiv(V, BV)
    NS = num_segments(tiles * N * H, NT // N, k.device)
    seg_h, seg_d = _segment_buffers(N * H * NS, K, V, k.device) if NS > 1 else (ht, ht)
    for seg_pass in scan_passes(NS):
        _fwd_h_kernel[(triton.cdiv(K, BK), triton.cdiv(V, BV), N * H * NS)](
            k, v, g, h, h0, ht, seg_h, seg_d, cu_seqlens, chunk_offsets, T,
            H=H, K=K, V=V, BT=BT, BK=BK, BV=BV, NS=NS, SPLIT=NS > 1, SCALAR=scalar, USE_H0=h0 is not None,
            IS_VARLEN=cu_seqlens is not None, SEG_PASS=seg_pass, **_cfg("fwd_h"))
    return h, ht


def _fwd(q, k, v, g, scale, h0, cu_seqlens, scalar, BT, BS):
    B, T, HQ, K = q.shape
    H, V = v.shape[2], v.shape[3]
    chunks = prepare_chunks(B, T, BT, cu_seqlens)
    NT, chunk_indices = chunks[1], chunks[2]
    h, ht = _states(k, v, g, h0, cu_seqlens, scalar, BT, chunks)
    o = torch.empty(B, T, HQ, V, dtype=v.dtype, device=v.device)
    cap = 128 if q.element_size() == 2 else 64   # fp32 tiles: half the size (shared memory)
    BKo = min(cap, max(16, next_pow2(K)))
    BVo = min(cap, max(16, next_pow2(V)))
    NTg = NT if cu_seqlens is not None else triton.cdiv(T, BT)
    _fwd_o_kernel[(triton.cdiv(V, BVo), NTg, B * HQ)](
        q, k, v, g, h, o, cu_seqlens, chunk_indices, scale, T,
        HQ=HQ, H=H, K=K, V=V, BT=BT, BK=BKo, BV=BVo, BS=BS, SCALAR=scalar,
        IS_VARLEN=cu_seqlens is not None, **_cfg("fwd_o"))
    return o, h, ht


def _bwd(q, k, v, g, h, ht, do, dht, scale, h0, cu_seqlens, scalar, BT, BS):
    B, T, HQ, K = q.shape
    H, V = v.shape[2], v.shape[3]
    N, NT, chunk_indices, chunk_offsets = prepare_chunks(B, T, BT, cu_seqlens)
    varlen = cu_seqlens is not None
    NTg = NT if varlen else triton.cdiv(T, BT)
    BK, BV = _blocks(K, V)
    dh = torch.empty(NT, H, K, V, dtype=k.dtype, device=k.device)
    dh0 = torch.empty(N, H, K, V, dtype=torch.float32, device=k.device) if h0 is not None else None
    tiles = triton.cdiv(K, BK) * triton.cdiv(V, BV)
    NS = num_segments(tiles * N * H, NT // N, k.device)
    seg_h, seg_d = _segment_buffers(N * H * NS, K, V, k.device) if NS > 1 else (dh, dh)
    for seg_pass in scan_passes(NS):
        _bwd_dh_kernel[(triton.cdiv(K, BK), triton.cdiv(V, BV), N * H * NS)](
            q, g, do, dh, dht, dh0, seg_h, seg_d, cu_seqlens, chunk_offsets, scale, T,
            HQ=HQ, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV, NS=NS, SPLIT=NS > 1, SCALAR=scalar,
            USE_DHT=dht is not None, STORE_DH0=h0 is not None, IS_VARLEN=varlen, SEG_PASS=seg_pass,
            **_cfg("bwd_dh"))

    dv = torch.empty_like(v)
    cap = 128 if q.element_size() == 2 else 64   # fp32 tiles: half the size (shared memory)
    BKv = min(cap, max(16, next_pow2(K)))
    BVv = min(cap, max(16, next_pow2(V)))
    _bwd_dv_kernel[(triton.cdiv(V, BVv), NTg, B * H)](
        q, k, g, do, dh, dv, cu_seqlens, chunk_indices, scale, T,
        HQ=HQ, H=H, K=K, V=V, BT=BT, BK=BKv, BV=BVv, BS=BS, SCALAR=scalar,
        IS_VARLEN=varlen, **_cfg("bwd_dv"))

    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    BKq = min(128 if scalar else min(cap, DQK_BK["gla"]), max(16, next_pow2(K)))
    BVq = min(64 if cap == 128 else 32, max(16, next_pow2(V)))
    NKq = triton.cdiv(K, BKq)
    if scalar:
        assert NKq == 1, "scalar-gate backward supports K <= 128"
        dG = torch.empty(B, T, H, dtype=torch.float32, device=q.device)
    else:
        dG = torch.empty(B, T, H, K, dtype=torch.float32, device=q.device)
    _bwd_dqk_kernel[(NKq, NTg, B * H)](
        q, k, v, g, h, do, dh, dq, dk, dG, cu_seqlens, chunk_indices, scale, T,
        HQ=HQ, H=H, K=K, V=V, BT=BT, BK=BKq, BV=BVq, BS=BS, SCALAR=scalar,
        IS_VARLEN=varlen, **_cfg("bwd_dqk"))

    carry = None
    if dht is not None:
        carry = (dht * ht).sum((-2, -1)) if scalar else (dht * ht).sum(-1)
    dg = reverse_cumsum(dG, g.dtype, carry, cu_seqlens)
    return dq, dk, dv, dg, dh0


class _ChunkLinearAttnFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, scale, initial_state, cu_seqlens, scalar, BT, BS):
        h0 = initial_state.float().contiguous() if initial_state is not None else None
        o, h, ht = _fwd(q, k, v, g, scale, h0, cu_seqlens, scalar, BT, BS)
        ctx.save_for_backward(q, k, v, g, h, ht, h0, cu_seqlens)
        ctx.meta = (scale, scalar, BT, BS, initial_state.dtype if initial_state is not None else None)
        ctx.set_materialize_grads(False)
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, g, h, ht, h0, cu_seqlens = ctx.saved_tensors
        scale, scalar, BT, BS, h0_dtype = ctx.meta
        if do is None:
            do = torch.zeros(q.shape[:3] + (v.shape[-1],), dtype=v.dtype, device=v.device)
        do = do.contiguous()
        if dht is not None:
            dht = dht.float().contiguous()
        dq, dk, dv, dg, dh0 = _bwd(q, k, v, g, h, ht, do, dht, scale, h0, cu_seqlens, scalar, BT, BS)
        if dh0 is not None:
            dh0 = dh0.to(h0_dtype)
        return dq, dk, dv, dg, None, dh0, None, None, None, None


# Under torch.compile the same kernels run as two custom ops (forward, backward): the graph stays whole around
# them, where the Function above would break it. The backward op recomputes the chunk states (one state scan)
# instead of saving them, so that every shape follows from the inputs' shapes.
@torch.library.custom_op("t2r::chunk_linear_attn", mutates_args=())
def _chunk_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, h0: torch.Tensor | None,
              cu_seqlens: torch.Tensor | None, scale: float, scalar: bool, chunk_size: int,
              sub_block: int) -> tuple[torch.Tensor, torch.Tensor]:
    o, _, ht = _fwd(q, k, v, g, scale, h0, cu_seqlens, scalar, chunk_size, sub_block)
    return o, ht


@_chunk_op.register_fake
def _(q, k, v, g, h0, cu_seqlens, scale, scalar, chunk_size, sub_block):
    B, T, HQ, K = q.shape
    H, V = v.shape[2], v.shape[3]
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    return v.new_empty(B, T, HQ, V), v.new_empty(N, H, K, V, dtype=torch.float32)


@torch.library.custom_op("t2r::chunk_linear_attn_backward", mutates_args=())
def _chunk_backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                       h0: torch.Tensor | None, cu_seqlens: torch.Tensor | None, ht: torch.Tensor,
                       do: torch.Tensor, dht: torch.Tensor, scale: float, scalar: bool, chunk_size: int,
                       sub_block: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    h, _ = _states(k, v, g, h0, cu_seqlens, scalar, chunk_size)
    dq, dk, dv, dg, dh0 = _bwd(q, k, v, g, h, ht, do.contiguous(), dht.contiguous(), scale, h0, cu_seqlens, scalar,
                               chunk_size, sub_block)
    return dq, dk, dv, dg, (dh0 if dh0 is not None else ht.new_empty(0))


@_chunk_backward_op.register_fake
def _(q, k, v, g, h0, cu_seqlens, ht, do, dht, scale, scalar, chunk_size, sub_block):
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), g.new_empty(g.shape),
            ht.new_empty(ht.shape) if h0 is not None else ht.new_empty(0))


def _chunk_op_setup(ctx, inputs, output):
    q, k, v, g, h0, cu_seqlens, *meta = inputs
    ctx.save_for_backward(q, k, v, g, h0, cu_seqlens, output[1])
    ctx.meta = meta


def _chunk_op_backward(ctx, do, dht):
    q, k, v, g, h0, cu_seqlens, ht = ctx.saved_tensors
    dq, dk, dv, dg, dh0 = _chunk_backward_op(q, k, v, g, h0, cu_seqlens, ht, do, dht, *ctx.meta)
    return dq, dk, dv, dg, (dh0 if h0 is not None else None), None, None, None, None, None


_chunk_op.register_autograd(_chunk_op_backward, setup_context=_chunk_op_setup)


def chunk_linear_attn_triton(q, k, v, g, scale=None, initial_state=None, output_final_state=False,
                             cu_seqlens=None, scalar=False, chunk_size=BT_DEFAULT, sub_block=16):
    """Shared entry of t2r.ops.gla's chunk_gla_triton (scalar=False, g [B,T,H,K]) and
    t2r.ops.simple_gla's chunk_simple_gla_triton (scalar=True, g [B,T,H]). fp16 inputs of the per-channel path run
    the kernels in bf16 (range of the decay factors); the output comes back in v's dtype."""
    B, T, HQ, K = q.shape
    H = k.shape[2]
    assert HQ % H == 0, "HQ must be a multiple of H"
    if cu_seqlens is not None:
        assert B == 1, "cu_seqlens needs B == 1"
        cu_seqlens = cu_seqlens.to(torch.int32).contiguous()
    if scale is None:
        scale = K ** -0.5
    out_dtype = v.dtype
    if q.dtype == torch.float16 and not scalar:
        # The anchored decay factors of the per-channel path reach 2^100 (one anchor) or the decay of
        # 8 steps (per block): past fp16's range (max 65504) for moderate gates, inside bf16's.
        q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    q, k, v, g = (t.contiguous() for t in (q, k, v, g))
    if torch.compiler.is_compiling():
        h0 = initial_state.float().contiguous() if initial_state is not None else None
        o, ht = _chunk_op(q, k, v, g, h0, cu_seqlens, float(scale), scalar, chunk_size, sub_block)
    else:
        o, ht = _ChunkLinearAttnFunction.apply(q, k, v, g, float(scale), initial_state, cu_seqlens,
                                               scalar, chunk_size, sub_block)
    return o.to(out_dtype), (ht if output_final_state else None)
