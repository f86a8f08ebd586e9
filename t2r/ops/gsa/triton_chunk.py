"""Triton chunkwise kernels for Gated Slot Attention (forward and backward).

GSA (paper eq. 6-7) is two gated-linear-attention passes joined by a softmax over the M
slots. Per kv head and chunk of BT = 64 steps, with b the cumulative log2 slot decay
inside the chunk (b_i[m] = log2(e) * sum_{s<=i} g_s[m]), Lam = 2^b, and the slot
memories K0 [K, M], V0 [M, V] entering the chunk:

    z  = (q' @ K0) * Lam + mix(tril(q' k^T), s)       q' = scale * q    (slot logits)
    p  = softmax_m(z)
    o  = (p * Lam) @ V0 + tril(A2) @ v,               A2_ij = sum_m p_i[m] s_j[m] 2^(b_i[m]-b_j[m])
    K1 = K0 * 2^b_last + k^T (s * 2^(b_last - b)),    V1 = 2^b_last * V0 + (s * 2^(b_last - b))^T v

with mix(X, s)_i[m] = sum_{j<=i} X_ij s_j[m] 2^(b_i[m]-b_j[m]). The per-slot decay factor
2^(b_i - b_j) is put on tensor cores by splitting it at an anchor row a:
2^(b_i - b_a) * 2^(b_a - b_j).
  * One anchor, the chunk's middle row, when the chunk's gate cumsum spreads over at most
    2^100 (every slot loses <= 69 nats over the chunk's 64 steps): each mix is one product.
    The GSA layer's logsigmoid(x)/8 gates always take this path.
  * Otherwise the middle row of each BS = 16-row block of rows i; for keys j before the
    block the second factor is <= 1, so each factor spans at most BS/2 steps of decay.
    Exact while no slot decays by more than ~70 nats over 8 consecutive steps (mean log
    gate >= -8.5 per step); beyond it the factors are clamped (finite, inaccurate).
The path is chosen per chunk: each per-chunk kernel runs in two launches, the one-anchor
variant over all chunks (skipping steep ones) and the sub-block variant over the list of steep
chunks that _fwd_o builds (see triton_intra.py).

Kernels (one launch each; the scans in triton_scan.py, the per-chunk kernels in triton_intra.py,
their shared pieces in triton_common.py, the host side here):
  fwd: _fwd_h    slot memories entering every chunk (sequential over chunks; long sequences in
                  parallel segments, see triton_utils.segment_of_sequence), final state
       _fwd_o    z (saved, fp32), softmax, o: fully parallel over (query head, chunk); also
                  flags the steep chunks (kept for the backward)
  bwd: _bwd_dp   per query head: dp (pass-2 read-out gradient), softmax backward dz,
                  row terms z*dz + p*dp of the gate gradient (fp32), and dq
       _bwd_dh    dK~, dV~ leaving every chunk (reverse scan, query-head group summed)
       _bwd_dqk   dk, pass-1 part of ds, gate gradient row terms summed over the group
       _bwd_dvs   dv, pass-2 part of ds, gate gradient per step
       _revcumsum     dg_t = sum_{s>=t} dB_s + <K~_T, dK~_T> + <V~_T, dV~_T>

Gate gradient: with B the global cumulative gate, dL/dB_t[m] = sum_heads (z dz + p dp)_t[m]
- s_t[m] ds_t[m]; dg is its reverse cumsum plus the final-state term.

GQA: states, k, v, s, g live on kv heads. Per-chunk kernels that produce per-query-head
results run one program per query head (adjacent programs share the kv tiles in L2);
everything summed over the group (dh, dk, dv, ds, dg) loops over the group's query
heads inside the program. Nothing is repeated in memory.

Triton 3.6 on Hopper miscompiles tl.trans of an MMA accumulator fed to another dot (fla
issue #640): every transposed product here (A^T, dA^T) is its own dot of loaded or
elementwise operands; only loaded/elementwise tiles are ever transposed.
"""

import torch
import triton

from ..triton_utils import (
    _sm_count,
    is_interpreting,
    next_pow2,
    num_segments,
    prepare_chunks,
    reverse_cumsum,
    scan_passes,
)
from .triton_intra import _bwd_dp_kernel, _bwd_dqk_kernel, _bwd_dvs_kernel, _fwd_o_kernel
from .triton_scan import _bwd_dh_kernel, _fwd_h_kernel

__all__ = ["chunk_gsa_triton", "CONFIGS"]

BT = 64
BS = 16
COLUMNS = 64  # output columns per step in _fwd_o (o) and _bwd_dp (dq): halves the live accumulator at D=128

# kernel -> (num_warps, num_stages); the benchmark may override, the GPU tests check these. With
# the one-anchor kernels on their own (no sub-block body capping their registers) the per-chunk
# kernels gained from a third stage (fwd_o, dp) and from 4 warps and 2 stages (dqk, dvs): 2.11 ->
# 1.91-1.93 ms fwd+bwd at the Mistral shape on the H100 (benchmarks/results/gsa_h100_split_2026-11-24.md,
# linear_ops_H100_quick_2026-11-25.md, with the GPU gradient checks of these pins).
CONFIGS = {
    "fwd_h": (4, 3),
    "fwd_o": (4, 3),
    "bwd_dp": (4, 3),
    "bwd_dh": (4, 3),
    "bwd_dqk": (4, 2),
    "bwd_dvs": (4, 2),
}

# Head dims up to 64 (SmolLM2) keep the per-chunk pins from before: the ones above were timed at
# D=128 only; these at D=64, with the launch split too (1.94 ms fwd+bwd, README).
CONFIGS_D64 = {"fwd_o": (4, 2), "bwd_dp": (4, 2), "bwd_dqk": (8, 1), "bwd_dvs": (8, 1)}

STEEP_PROGRAMS: int | None = None
"""Programs (per query head) of the sub-block launches, striding through the list of steep chunks;
None: one per SM. Tests set it small so that each program takes several chunks."""


def _cfg(name, D=128):
    """Launch config of kernel `name` for head-dim tiles of width D."""
    w, s = CONFIGS_D64[name] if D <= 64 and name in CONFIGS_D64 else CONFIGS[name]
    return dict(num_warps=w, num_stages=s)


# --------------------------------------------------------------------------------------
# host side
# --------------------------------------------------------------------------------------
def _tile(D: int) -> int:
    """Full tile along K, V or M. On the GPU at least 64: with 16-wide tiles the Triton 3.6
    Hopper build of the backward kernels hit illegal memory accesses (seen at K=16, V=32,
    M=16); only 64- and 128-wide tiles were checked on the H100."""
    return next_pow2(D) if is_interpreting() else max(64, next_pow2(D))


def _split(D: int) -> int:
    """Block of the state scans along K or V (several programs per head for parallelism)."""
    return min(64, next_pow2(D)) if is_interpreting() else 64


def _steep_programs(n: int, device) -> int:
    """Program count P of the sub-block launches over n (chunk, kv head) pairs."""
    if STEEP_PROGRAMS is not None:
        P = STEEP_PROGRAMS
    elif device.type == "cuda":
        P = _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    else:
        P = 4
    return max(1, min(n, P))


def _chunk_lists(n: int, device) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Per (chunk, kv head) flags (1: steep, sub-blocks), the list [count, entries...] of the steep
    ones (both filled by _fwd_o), and the program count P of the sub-block launches."""
    flags = torch.empty(n, dtype=torch.int8, device=device)
    return flags, torch.zeros(n + 1, dtype=torch.int32, device=device), _steep_programs(n, device)


def _segment_buffers(n: int, K: int, V: int, M: int, device):
    """End states of the key and value memories ([n, K, M], [n, M, V]) and the total log2 slot
    decays [n, M] of the segments of a segmented scan."""
    f32 = dict(dtype=torch.float32, device=device)
    return torch.empty(n, K, M, **f32), torch.empty(n, M, V, **f32), torch.empty(n, M, **f32)


def _states(q, k, v, s, g, h0k, h0v, output_final_state, cu_seqlens, chunks=None):
    """(hk, hv, htk, htv): key and value slot memories entering every chunk, and the final ones (or None).
    `chunks`: what `prepare_chunks` gives for these sizes, if the caller has it (with cu_seqlens it reads the
    device)."""
    B, T, HQ, K = q.shape
    H, V, M = k.shape[2], v.shape[3], s.shape[3]
    N, NTT, _, chunk_offsets = chunks or prepare_chunks(B, T, BT, cu_seqlens)
    BM = _tile(M)
    BKs, BVs = _split(K), _split(V)
    NK, NV = triton.cdiv(K, BKs), triton.cdiv(V, BVs)
    sdt = q.dtype
    hk = q.new_empty(NTT, H, K, M, dtype=sdt)
    hv = q.new_empty(NTT, H, M, V, dtype=sdt)
    htk = q.new_empty(N, H, K, M, dtype=torch.float32) if output_final_state else None
    htv = q.new_empty(N, H, M, V, dtype=torch.float32) if output_final_state else None
    use_h0 = h0k is not None
    NS = num_segments((NK + NV) * N * H, NTT // N, q.device)
    seg = _segment_buffers(N * H * NS, K, V, M, q.device) if NS > 1 else (hk, hv, hk)
    for seg_pass in scan_passes(NS):
        _fwd_h_kernel[(NK + NV, N * H * NS)](
            k, v, s, g, hk, hv, h0k if use_h0 else hk, h0v if use_h0 else hv,
            htk if output_final_state else hk, htv if output_final_state else hv, *seg,
            cu_seqlens, chunk_offsets, T,
            H=H, K=K, V=V, M=M, BT=BT, BK=BKs, BV=BVs, BM=BM, NK=NK, NS=NS, SPLIT=NS > 1,
            USE_H0=use_h0, STORE_HT=output_final_state, IS_VARLEN=cu_seqlens is not None, SEG_PASS=seg_pass,
            **_cfg("fwd_h"))
    return hk, hv, htk, htv


def _fwd(q, k, v, s, g, scale, h0k, h0v, output_final_state, cu_seqlens):
    B, T, HQ, K = q.shape
    H, V, M = k.shape[2], v.shape[3], s.shape[3]
    G = HQ // H
    N, NTT, chunk_indices, chunk_offsets = prepare_chunks(B, T, BT, cu_seqlens)
    BKf, BVf, BM = _tile(K), _tile(V), _tile(M)
    BD = max(BKf, BVf)
    hk, hv, htk, htv = _states(q, k, v, s, g, h0k, h0v, output_final_state, cu_seqlens,
                               (N, NTT, chunk_indices, chunk_offsets))
    o = torch.empty(B, T, HQ, V, dtype=v.dtype, device=q.device)
    z = torch.empty(B, T, HQ, M, dtype=torch.float32, device=q.device)
    p = torch.empty(B, T, HQ, M, dtype=q.dtype, device=q.device)
    NTg = NTT if cu_seqlens is not None else triton.cdiv(T, BT)
    Bg = 1 if cu_seqlens is not None else B
    flags, steep, P = _chunk_lists(NTg * Bg * H, q.device)
    for one, grid in ((True, (G, NTg, Bg * H)), (False, (G, P))):
        _fwd_o_kernel[grid](
            q, k, v, s, g, hk, hv, o, z, p, flags, steep, cu_seqlens, chunk_indices, scale, T, Bg * H,
            HQ=HQ, H=H, K=K, V=V, M=M, BT=BT, BS=BS, BK=BKf, BV=BVf, BM=BM, BC=min(BVf, COLUMNS),
            IS_VARLEN=cu_seqlens is not None, ONE=one, **_cfg("fwd_o", BD))
    return o, z, p, hk, hv, htk, htv, (N, NTT, chunk_indices, chunk_offsets), (flags, steep, P)


def _bwd(q, k, v, s, g, scale, z, p, hk, hv, do, dhtk, dhtv, htk, htv, need_dh0, cu_seqlens, chunks, lists):
    B, T, HQ, K = q.shape
    H, V, M = k.shape[2], v.shape[3], s.shape[3]
    G = HQ // H
    N, NTT, chunk_indices, chunk_offsets = chunks
    BKf, BVf, BM = _tile(K), _tile(V), _tile(M)
    BD = max(BKf, BVf)
    BKs, BVs = _split(K), _split(V)
    NK, NV = triton.cdiv(K, BKs), triton.cdiv(V, BVs)
    varlen = cu_seqlens is not None
    NTg = NTT if varlen else triton.cdiv(T, BT)
    Bg = 1 if varlen else B
    flags, steep, P = lists
    do = do.contiguous()

    dz = torch.empty(z.shape, dtype=q.dtype, device=q.device)   # only ever a dot operand (after scaling)
    r = torch.empty_like(z)
    dq = torch.empty_like(q)
    for one, grid in ((True, (G, NTg, Bg * H)), (False, (G, P))):
        _bwd_dp_kernel[grid](
            q, k, v, s, g, hk, hv, z, do, dz, r, dq, flags, steep, cu_seqlens, chunk_indices, scale, T, Bg * H,
            HQ=HQ, H=H, K=K, V=V, M=M, BT=BT, BS=BS, BK=BKf, BV=BVf, BM=BM, BC=min(BKf, COLUMNS),
            IS_VARLEN=varlen, ONE=one, **_cfg("bwd_dp", BD))

    sdt = q.dtype
    dhk = q.new_empty(NTT, H, K, M, dtype=sdt)
    dhv = q.new_empty(NTT, H, M, V, dtype=sdt)
    use_dht = dhtk is not None
    dh0k = q.new_empty(N, H, K, M, dtype=torch.float32) if need_dh0 else None
    dh0v = q.new_empty(N, H, M, V, dtype=torch.float32) if need_dh0 else None
    NS = num_segments((NK + NV) * N * H, NTT // N, q.device)
    seg = _segment_buffers(N * H * NS, K, V, M, q.device) if NS > 1 else (dhk, dhv, dhk)
    for seg_pass in scan_passes(NS):
        _bwd_dh_kernel[(NK + NV, N * H * NS)](
            q, g, p, dz, do, dhk, dhv, dhtk if use_dht else dhk, dhtv if use_dht else dhv,
            dh0k if need_dh0 else dhk, dh0v if need_dh0 else dhv, *seg, cu_seqlens, chunk_offsets, scale, T,
            HQ=HQ, H=H, K=K, V=V, M=M, BT=BT, BK=BKs, BV=BVs, BM=BM, NK=NK, NS=NS, SPLIT=NS > 1,
            USE_DHT=use_dht, STORE_DH0=need_dh0, IS_VARLEN=varlen, SEG_PASS=seg_pass, **_cfg("bwd_dh"))

    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    ds = torch.empty_like(s)
    ds1 = torch.empty(s.shape, dtype=torch.float32, device=s.device)
    dB = torch.empty(s.shape, dtype=torch.float32, device=s.device)
    for one, grid in ((True, (NTg, Bg * H)), (False, (P,))):   # dvs reads ds1, dB of every chunk
        _bwd_dqk_kernel[grid](
            q, k, s, g, dz, r, dhk, dk, ds1, dB, flags, steep, cu_seqlens, chunk_indices, scale, T, Bg * H,
            HQ=HQ, H=H, K=K, M=M, BT=BT, BS=BS, BK=BKf, BM=BM, IS_VARLEN=varlen, ONE=one, **_cfg("bwd_dqk", BD))
    for one, grid in ((True, (NTg, Bg * H)), (False, (P,))):
        _bwd_dvs_kernel[grid](
            v, s, g, p, do, dhv, dv, ds1, ds, dB, flags, steep, cu_seqlens, chunk_indices, T, Bg * H,
            HQ=HQ, H=H, V=V, M=M, BT=BT, BS=BS, BV=BVf, BM=BM, IS_VARLEN=varlen, ONE=one, **_cfg("bwd_dvs", BD))

    carry = None
    if use_dht:
        carry = (htk * dhtk.float()).sum(2) + (htv * dhtv.float()).sum(3)      # [N, H, M]
    dg = reverse_cumsum(dB, g.dtype, carry, cu_seqlens,
                        block_d=min(16, next_pow2(dB.shape[-1])), num_warps=2, num_stages=3)
    return dq, dk, dv, ds, dg, dh0k, dh0v


class ChunkGSAFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, s, g, scale, h0k, h0v, output_final_state, cu_seqlens):
        q, k, v, s, g = (t.contiguous() for t in (q, k, v, s, g))
        if h0k is not None:
            h0k, h0v = h0k.contiguous(), h0v.contiguous()
        # the final state is always computed: it feeds the gate gradient's carry term
        o, z, p, hk, hv, htk, htv, chunks, (flags, steep, P) = _fwd(q, k, v, s, g, scale, h0k, h0v, True, cu_seqlens)
        ctx.save_for_backward(q, k, v, s, g, z, p, hk, hv, htk, htv, h0k, cu_seqlens, flags, steep,
                              *(t for t in chunks[2:] if t is not None))
        ctx.scale, ctx.chunks_n, ctx.steep_programs = scale, chunks[:2], P
        ctx.has_h0 = h0k is not None
        ctx.h0_dtypes = (h0k.dtype, h0v.dtype) if h0k is not None else None
        if output_final_state:
            return o, htk, htv
        return o, None, None

    @staticmethod
    def backward(ctx, do, dhtk, dhtv):
        q, k, v, s, g, z, p, hk, hv, htk, htv, h0k, cu_seqlens, flags, steep, *tables = ctx.saved_tensors
        chunk_indices, chunk_offsets = (tables if tables else (None, None))
        chunks = (*ctx.chunks_n, chunk_indices, chunk_offsets)
        if dhtk is None and dhtv is not None:
            dhtk = torch.zeros_like(htk)
        if dhtv is None and dhtk is not None:
            dhtv = torch.zeros_like(htv)
        if dhtk is not None:
            dhtk, dhtv = dhtk.contiguous(), dhtv.contiguous()
        dq, dk, dv, ds, dg, dh0k, dh0v = _bwd(
            q, k, v, s, g, ctx.scale, z, p, hk, hv, do, dhtk, dhtv, htk, htv, ctx.has_h0, cu_seqlens, chunks,
            (flags, steep, ctx.steep_programs))
        if ctx.has_h0:
            dh0k, dh0v = dh0k.to(ctx.h0_dtypes[0]), dh0v.to(ctx.h0_dtypes[1])
        return dq, dk, dv, ds, dg, None, dh0k, dh0v, None, None


# Under torch.compile the same kernels run as two custom ops (forward, backward): the graph stays whole around
# them, where the Function above would break it. The forward returns what backward reads besides the inputs
# (z, p, the steep-chunk flags and list, whose size follows the chunk count: data-dependent with cu_seqlens);
# the backward recomputes the slot memories entering each chunk (one state scan) instead of saving them.
_Tensors7 = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


@torch.library.custom_op("t2r::chunk_gsa", mutates_args=())
def _chunk_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: torch.Tensor, g: torch.Tensor,
              h0k: torch.Tensor | None, h0v: torch.Tensor | None, cu_seqlens: torch.Tensor | None,
              scale: float) -> _Tensors7:
    o, z, p, _, _, htk, htv, _, (flags, steep, _) = _fwd(q, k, v, s, g, scale, h0k, h0v, True, cu_seqlens)
    return o, htk, htv, z, p, flags, steep


@_chunk_op.register_fake
def _(q, k, v, s, g, h0k, h0v, cu_seqlens, scale):
    B, T, HQ, K = q.shape
    H, V, M = k.shape[2], v.shape[3], s.shape[3]
    if cu_seqlens is None:
        N, pairs = B, triton.cdiv(T, BT) * B * H
    else:  # chunks of all packed sequences: known once cu_seqlens is read
        N, pairs = cu_seqlens.shape[0] - 1, torch.library.get_ctx().new_dynamic_size() * H
    f32 = dict(dtype=torch.float32)
    return (v.new_empty(B, T, HQ, V), q.new_empty(N, H, K, M, **f32), q.new_empty(N, H, M, V, **f32),
            q.new_empty(B, T, HQ, M, **f32), q.new_empty(B, T, HQ, M), q.new_empty(pairs, dtype=torch.int8),
            q.new_empty(pairs + 1, dtype=torch.int32))


@torch.library.custom_op("t2r::chunk_gsa_backward", mutates_args=())
def _chunk_backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: torch.Tensor, g: torch.Tensor,
                       h0k: torch.Tensor | None, h0v: torch.Tensor | None, cu_seqlens: torch.Tensor | None,
                       htk: torch.Tensor, htv: torch.Tensor, z: torch.Tensor, p: torch.Tensor, flags: torch.Tensor,
                       steep: torch.Tensor, do: torch.Tensor, dhtk: torch.Tensor, dhtv: torch.Tensor,
                       scale: float) -> _Tensors7:
    chunks = prepare_chunks(q.shape[0], q.shape[1], BT, cu_seqlens)
    hk, hv, _, _ = _states(q, k, v, s, g, h0k, h0v, False, cu_seqlens, chunks)
    dq, dk, dv, ds, dg, dh0k, dh0v = _bwd(
        q, k, v, s, g, scale, z, p, hk, hv, do.contiguous(), dhtk.contiguous(), dhtv.contiguous(), htk, htv,
        h0k is not None, cu_seqlens, chunks, (flags, steep, _steep_programs(flags.numel(), q.device)))
    if h0k is None:
        return dq, dk, dv, ds, dg, htk.new_empty(0), htv.new_empty(0)
    return dq, dk, dv, ds, dg, dh0k.to(h0k.dtype), dh0v.to(h0v.dtype)


@_chunk_backward_op.register_fake
def _(q, k, v, s, g, h0k, h0v, cu_seqlens, htk, htv, z, p, flags, steep, do, dhtk, dhtv, scale):
    grads = tuple(t.new_empty(t.shape) for t in (q, k, v, s, g))
    if h0k is None:
        return (*grads, htk.new_empty(0), htv.new_empty(0))
    return (*grads, h0k.new_empty(h0k.shape), h0v.new_empty(h0v.shape))


def _chunk_op_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:8], *output[1:])
    ctx.scale = inputs[8]
    ctx.mark_non_differentiable(*output[3:])


def _chunk_op_backward(ctx, do, dhtk, dhtv, *_):
    saved = ctx.saved_tensors
    dq, dk, dv, ds, dg, dh0k, dh0v = _chunk_backward_op(*saved, do, dhtk, dhtv, ctx.scale)
    if saved[5] is None:
        dh0k = dh0v = None
    return dq, dk, dv, ds, dg, dh0k, dh0v, None, None


_chunk_op.register_autograd(_chunk_op_backward, setup_context=_chunk_op_setup)


def chunk_gsa_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    s: torch.Tensor,
    g: torch.Tensor,
    scale: float | None = None,
    initial_state: tuple[torch.Tensor, torch.Tensor] | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """Chunkwise GSA on Triton (forward and backward); same contract as `t2r.ops.gsa`. fp16 inputs
    run the kernels in bf16 (range of the decay factors); the output comes back in v's dtype."""
    K = q.shape[-1]
    scale = K ** -0.5 if scale is None else float(scale)
    h0k, h0v = (None, None) if initial_state is None else tuple(initial_state)
    if cu_seqlens is not None:
        cu_seqlens = cu_seqlens.to(device=q.device, dtype=torch.int32).contiguous()
    out_dtype = v.dtype
    if q.dtype == torch.float16:
        # the anchored slot-decay factors (up to 2^100, or 8 steps of decay per block) overflow
        # fp16 (max 65504) for moderate gates; bf16 holds them
        q, k, v, s = (t.to(torch.bfloat16) for t in (q, k, v, s))
    if torch.compiler.is_compiling():
        contiguous = [None if t is None else t.contiguous() for t in (q, k, v, s, g, h0k, h0v)]
        o, htk, htv, *_ = _chunk_op(*contiguous, cu_seqlens, scale)
    else:
        o, htk, htv = ChunkGSAFunction.apply(q, k, v, s, g, scale, h0k, h0v, output_final_state, cu_seqlens)
    return o.to(out_dtype), ((htk, htv) if output_final_state else None)
