"""Shared pieces of the Triton linear-attention kernels (GLA, simple GLA, GSA).

* ``prepare_chunks``: chunk bookkeeping for packed variable-length batches.
* ``chunk_bounds`` / ``seq_bounds``: where a program's chunk or sequence lies (fixed length or packed).
* ``num_segments`` / ``segment_of_sequence`` / ``carry_through_segments`` / ``store_segment``:
  cutting long sequences into segments so that state scans run in parallel when batch x heads
  alone cannot fill the GPU.
* ``reverse_cumsum``: the last step of every gate gradient, dg_t = sum_{s >= t} dG_s,
  per sequence, with an optional carry (the final-state term) added to every step.

Gates enter the kernels in log2 space (g * 1/ln 2, then exp2).
"""
import functools

import torch
import triton
import triton.language as tl

from .utils import OffsetsMemo

__all__ = ["RCP_LN2", "prepare_chunks", "reverse_cumsum", "next_pow2", "is_interpreting", "num_segments",
           "segment_of_sequence", "carry_through_segments", "store_segment", "scan_passes", "chunk_bounds",
           "seq_bounds", "fits_one_anchor", "ONE_ANCHOR_SPAN"]

RCP_LN2 = 1.4426950408889634  # 1 / ln 2


def next_pow2(n: int) -> int:
    return triton.next_power_of_2(int(n))


def is_interpreting() -> bool:
    import os
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def patch_interpreter() -> None:
    """Make Triton 3.6's CPU interpreter work with NumPy >= 2.4.

    The interpreter turns a scalar tensor into a loop bound with ``int(handle.data)``, and
    NumPy 2.4 refuses ``int()`` of a 1-element 1-d array; read the element instead.
    Idempotent; a no-op unless TRITON_INTERPRET=1.
    """
    if not is_interpreting():
        return
    from triton.runtime import interpreter
    if getattr(interpreter._patch_lang_tensor, "_t2r_patched", False):
        return
    import numpy as np
    orig = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    patched._t2r_patched = True
    interpreter._patch_lang_tensor = patched


patch_interpreter()


def prepare_chunks(
    B: int, T: int, BT: int, cu_seqlens: torch.Tensor | None
) -> tuple[int, int, torch.Tensor | None, torch.Tensor | None]:
    """Return (N, NT_total, chunk_indices, chunk_offsets).

    Without cu_seqlens: N = B sequences of T steps, NT_total = B * cdiv(T, BT), no tables.
    With cu_seqlens [N+1]: chunk_indices [NT_total, 2] int32 = (sequence, chunk within it),
    chunk_offsets [N+1] int32 = index of each sequence's first chunk. Chunks are numbered
    sequence by sequence, so a chunk's global number is also its slot in the state buffer.
    """
    if cu_seqlens is None:
        return B, B * triton.cdiv(T, BT), None, None
    return _CHUNK_TABLES.get(cu_seqlens, BT, lambda: _chunk_tables(BT, cu_seqlens))


_CHUNK_TABLES = OffsetsMemo()
"""The chunk tables of the last offsets tensors (key: the chunk size BT): made, with the host sync that sizes
them, once a micro-batch instead of once a layer and pass."""


def _chunk_tables(BT: int, cu_seqlens: torch.Tensor):
    cu = cu_seqlens.to(torch.int64)
    N = cu.numel() - 1
    nchunks = (cu[1:] - cu[:-1] + BT - 1) // BT
    offsets = torch.zeros(N + 1, dtype=torch.int64, device=cu.device)
    offsets[1:] = torch.cumsum(nchunks, 0)
    total = int(offsets[-1].item())
    seq = torch.repeat_interleave(torch.arange(N, device=cu.device), nchunks, output_size=total)
    local = torch.arange(total, device=cu.device) - offsets[seq]
    indices = torch.stack([seq, local], 1).to(torch.int32).contiguous()
    return N, total, indices, offsets.to(torch.int32).contiguous()


@triton.jit
def chunk_bounds(i_tc, i_b, T, cu_seqlens, chunk_indices, BT: tl.constexpr, IS_VARLEN: tl.constexpr):
    """(i_t chunk within its sequence, bos, T of the sequence, global chunk index) of program chunk i_tc
    (batch i_b without cu_seqlens; the chunk table of prepare_chunks with them)."""
    if IS_VARLEN:
        i_n = tl.load(chunk_indices + i_tc * 2)
        i_t = tl.load(chunk_indices + i_tc * 2 + 1)
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
        T = (eos - bos).to(tl.int32)
        i_c = i_tc.to(tl.int64)
    else:
        i_t = i_tc
        bos = (i_b * T).to(tl.int64)
        i_c = (i_b * tl.cdiv(T, BT) + i_t).to(tl.int64)
    return i_t, bos, T, i_c


@triton.jit
def seq_bounds(i_n, T, cu_seqlens, chunk_offsets, BT: tl.constexpr, IS_VARLEN: tl.constexpr):
    """(bos, T, number of chunks, index of the first chunk) of sequence i_n."""
    if IS_VARLEN:
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
        T = (eos - bos).to(tl.int32)
        NT = tl.cdiv(T, BT)
        boh = tl.load(chunk_offsets + i_n).to(tl.int64)
    else:
        bos = (i_n * T).to(tl.int64)
        NT = tl.cdiv(T, BT)
        boh = (i_n * NT).to(tl.int64)
    return bos, T, NT, boh


ONE_ANCHOR_SPAN = tl.constexpr(100.0)
"""Largest log2 spread of a chunk's gate cumsum for which the GLA and GSA kernels split every decay
factor at one anchor row: factors up to 2^100 leave 2^28 of fp32 headroom for a dot's sum."""


@triton.jit
def fits_one_anchor(b):
    """True when one anchor row keeps every factor 2^(b_i - b_a), 2^(b_a - b_j) of this [BT, D] tile
    of log2 gate cumsums within 2^+-ONE_ANCHOR_SPAN: the chunk's decay matrix is then a single
    tensor-core product instead of one per sub-block."""
    span = tl.max(tl.max(b, axis=1), axis=0) - tl.min(tl.min(b, axis=1), axis=0)
    return span <= ONE_ANCHOR_SPAN


def scan_passes(NS: int) -> tuple:
    """SEG_PASS of each launch of a state scan cut into NS segments: the segment-end pass first when split."""
    return (True, False) if NS > 1 else (False,)


SEGMENTS: int | None = None
"""Override of num_segments (tests set it to split short sequences; None: automatic)."""


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def num_segments(programs: int, chunks_per_sequence: int, device: torch.device) -> int:
    """How many segments to cut each sequence into for a state scan of `programs` sequential
    programs over `chunks_per_sequence` chunks. Splitting costs a second launch (each segment is
    scanned from zero first, see segment_of_sequence), so sequences stay whole while the programs
    half-fill the GPU and are at most 128 chunks long (on the H100 at B=4, T=4K, two segments
    were 0.05 ms slower per scan); otherwise aim at 4 programs per SM and segments of <= 64
    chunks, never shorter than 16 chunks."""
    if SEGMENTS is not None:
        return SEGMENTS
    sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device()) \
        if device.type == "cuda" else 4
    if 2 * programs >= sms and chunks_per_sequence <= 128:
        return 1
    want = max(triton.cdiv(4 * sms, programs), triton.cdiv(chunks_per_sequence, 64))
    return max(1, min(want, chunks_per_sequence // 16))


@triton.jit
def segment_of_sequence(i_sg, NT, NS):
    """[c_lo, c_hi): the chunks of segment i_sg when a sequence of NT chunks is cut into NS segments
    (the last ones may be empty). NS is a runtime value: kernels compile once per split / unsplit,
    not once per segment count.

    Segmented state scans run in two launches: the first scans every segment from a zero state
    and stores its end state E_j and its total log2 decay D_j; the second starts segment i from
    the true state, h0 carried through segments j < i as h <- 2^D_j * h + E_j (the recurrence is
    linear, with diagonal decay), then scans and stores its chunk states."""
    L = tl.cdiv(NT, NS)
    c_lo = i_sg * L
    return c_lo, tl.minimum(NT, c_lo + L)


@triton.jit
def carry_through_segments(b_h, seg_h, seg_d, j0, n, step, R: tl.constexpr, C: tl.constexpr, r0, c0,
                           DD: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr, DECAY_ROWS: tl.constexpr):
    """The state tile b_h [BR, BC] (at (r0, c0) of an [R, C] state) carried through the n segments
    j0, j0 + step, ...: h <- 2^D_j * h + E_j, with E_j = seg_h[j] and the log2 decay D_j = seg_d[j]
    [DD] along the tile's rows (DECAY_ROWS) or columns."""
    for jj in range(n):
        j = j0 + jj * step
        p_e = tl.make_block_ptr(seg_h + j * R * C, (R, C), (C, 1), (r0, c0), (BR, BC), (1, 0))
        if DECAY_ROWS:
            o = r0 + tl.arange(0, BR)
            b_d = tl.load(seg_d + j * DD + o, mask=o < DD, other=0.)
            b_h = b_h * tl.exp2(b_d)[:, None] + tl.load(p_e, boundary_check=(0, 1))
        else:
            o = c0 + tl.arange(0, BC)
            b_d = tl.load(seg_d + j * DD + o, mask=o < DD, other=0.)
            b_h = b_h * tl.exp2(b_d)[None, :] + tl.load(p_e, boundary_check=(0, 1))
    return b_h


@triton.jit
def store_segment(b_h, b_dsum, seg_h, seg_d, j, R: tl.constexpr, C: tl.constexpr, r0, c0,
                  DD: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr, DECAY_ROWS: tl.constexpr,
                  STORE_DECAY: tl.constexpr):
    """Segment j's end state (tile b_h at (r0, c0) of [R, C]) and, with STORE_DECAY, its log2
    decay b_dsum [BR] or [BC] along rows (DECAY_ROWS) or columns: the first pass of a segmented scan."""
    p_e = tl.make_block_ptr(seg_h + j * R * C, (R, C), (C, 1), (r0, c0), (BR, BC), (1, 0))
    tl.store(p_e, b_h, boundary_check=(0, 1))
    if STORE_DECAY:
        if DECAY_ROWS:
            o = r0 + tl.arange(0, BR)
        else:
            o = c0 + tl.arange(0, BC)
        tl.store(seg_d + j * DD + o, b_dsum, mask=o < DD)


@triton.jit
def _segment_sum_kernel(
    x, seg_sum, cu_seqlens, seg_indices, T,
    H: tl.constexpr, D: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr, SEG: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    # seg_sum[segment, h, d] = sum of x over the segment's SEG rows; one program per (D-block, segment, h).
    i_d, i_sg, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    # segments are the "chunks" of prepare_chunks(..., SEG, ...): (segment in sequence, bos, T, global index)
    i_s, bos, T, i_seg = chunk_bounds(i_sg, i_b, T, cu_seqlens, seg_indices, SEG, IS_VARLEN)
    o_d = i_d * BD + tl.arange(0, BD)
    b_acc = tl.zeros([BD], dtype=tl.float32)
    for i_t in range(i_s * (SEG // BT), tl.minimum(tl.cdiv(T, BT), (i_s + 1) * (SEG // BT))):
        p_x = tl.make_block_ptr(x + (bos * H + i_h) * D, (T, D), (H * D, 1), (i_t * BT, i_d * BD), (BT, BD), (1, 0))
        b_acc += tl.sum(tl.load(p_x, boundary_check=(0, 1)).to(tl.float32), axis=0)
    tl.store(seg_sum + (i_seg * H + i_h) * D + o_d, b_acc, mask=o_d < D)


@triton.jit
def _reverse_cumsum_kernel(
    x, y, seg_sum, carry, cu_seqlens, seg_indices, T,
    H: tl.constexpr, D: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr, SEG: tl.constexpr,
    HAS_CARRY: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    # x, y: [total_T, H, D] (D = 1 for scalar gates); one program per (D-block, segment, h):
    # y = carry + (sums of the sequence's later segments) + reverse cumsum inside the segment.
    i_d, i_sg, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    i_s, bos, T, i_seg = chunk_bounds(i_sg, i_b, T, cu_seqlens, seg_indices, SEG, IS_VARLEN)
    first = i_seg - i_s   # global index of the sequence's first segment
    if IS_VARLEN:
        i_n = tl.load(seg_indices + i_sg * 2)
    else:
        i_n = i_b
    o_d = i_d * BD + tl.arange(0, BD)
    m_d = o_d < D
    if HAS_CARRY:
        b_c = tl.load(carry + (i_n * H + i_h) * D + o_d, mask=m_d, other=0.).to(tl.float32)
    else:
        b_c = tl.zeros([BD], dtype=tl.float32)
    for j in range(i_s + 1, tl.cdiv(T, SEG)):
        b_c += tl.load(seg_sum + ((first + j) * H + i_h) * D + o_d, mask=m_d, other=0.)
    c_lo = i_s * (SEG // BT)
    NC = tl.minimum(tl.cdiv(T, BT), c_lo + SEG // BT) - c_lo
    for i in range(NC):
        i_t = c_lo + NC - 1 - i
        p_x = tl.make_block_ptr(x + (bos * H + i_h) * D, (T, D), (H * D, 1), (i_t * BT, i_d * BD), (BT, BD), (1, 0))
        p_y = tl.make_block_ptr(y + (bos * H + i_h) * D, (T, D), (H * D, 1), (i_t * BT, i_d * BD), (BT, BD), (1, 0))
        b_x = tl.load(p_x, boundary_check=(0, 1)).to(tl.float32)
        b_y = tl.cumsum(b_x, axis=0, reverse=True) + b_c[None, :]
        tl.store(p_y, b_y.to(p_y.dtype.element_ty), boundary_check=(0, 1))
        b_c += tl.sum(b_x, axis=0)


def reverse_cumsum(x: torch.Tensor, out_dtype: torch.dtype, carry: torch.Tensor | None = None,
                   cu_seqlens: torch.Tensor | None = None, block_d: int | None = None,
                   num_warps: int = 4, num_stages: int | None = None, segment: int = 512) -> torch.Tensor:
    """y_t = carry + sum_{s >= t, same sequence} x_s along time.

    x: [B, T, H] or [B, T, H, D] fp32; carry: [N, H] or [N, H, D] (N sequences) or None.
    Parallel over segments of `segment` steps (a multiple of 64): one launch sums each segment,
    a second adds the later segments' sums to a reverse cumsum inside each segment, so a long
    sequence is not one sequential scan.
    `block_d` / `num_warps` / `num_stages` let a caller pin its launch config (GSA uses 16 / 2 / 3:
    more, smaller programs).
    """
    BT = 64
    assert segment % BT == 0, "segment must be a multiple of 64"
    scalar = x.dim() == 3
    B, T, H = x.shape[:3]
    D = 1 if scalar else x.shape[3]
    y = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    N, NS, seg_indices, _ = prepare_chunks(B, T, segment, cu_seqlens)
    seg_sum = torch.empty(NS, H, D, dtype=torch.float32, device=x.device)
    BD = block_d or min(64, max(16, next_pow2(D)))   # no size-1 block dims (scalar gates: D = 1, masked)
    varlen = cu_seqlens is not None
    grid = (triton.cdiv(D, BD), NS if varlen else triton.cdiv(T, segment), H if varlen else B * H)
    launch = dict(num_warps=num_warps) if num_stages is None else dict(num_warps=num_warps, num_stages=num_stages)
    _segment_sum_kernel[grid](x, seg_sum, cu_seqlens, seg_indices, T, H=H, D=D, BT=BT, BD=BD, SEG=segment,
                              IS_VARLEN=varlen, **launch)
    _reverse_cumsum_kernel[grid](
        x, y, seg_sum, carry.contiguous() if carry is not None else x, cu_seqlens, seg_indices, T,
        H=H, D=D, BT=BT, BD=BD, SEG=segment, HAS_CARRY=carry is not None, IS_VARLEN=varlen, **launch,
    )
    return y
