"""Sliding-window + sink attention through PyTorch's FlexAttention: the visibility rule of `naive.py` as a
`mask_mod`, so one fused kernel skips the blocks it hides (compiled on CUDA; eager elsewhere, for tests)."""

import functools

import torch


@functools.lru_cache(maxsize=1)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


_last_mask: tuple = ()
"""(positions, real, window, sinks, shape, block mask) of the last call: every layer of one forward passes the
same position tensor, so the mask is built once per forward. The key holds the tensors themselves (compared by
identity), so they cannot be freed and their memory reused under the same key."""


BLOCK = 128
"""FlexAttention's block size (queries and keys)."""


def _reachable_blocks(positions, window: int, sinks: int, length: int) -> torch.Tensor:
    """`[B, 1, NB, NB]` bool: key block j may hold a key some query of block i sees. A superset, from block
    distances alone: the causal blocks within reach of the window, and any block holding a document's first
    `sinks` positions (a sink). Every block it keeps is computed with the exact `mask_mod`; none is full."""
    blocks = -(-length // BLOCK)
    pad = blocks * BLOCK - length
    starts = torch.arange(blocks, device=positions.device)
    gap = (starts[:, None] - starts[None, :]) * BLOCK - (BLOCK - 1)   # nearest query-key distance of two blocks
    causal = starts[None, :] <= starts[:, None]
    sink = torch.nn.functional.pad(positions < sinks, (0, pad)).view(len(positions), blocks, BLOCK).any(-1)
    return (causal & ((gap < window) | sink[:, None, :]))[:, None]


def _block_mask(positions, real, window: int, sinks: int, batch: int, length: int, device):
    """The `BlockMask` of `naive.py`'s visibility rule, built from block distances (`_reachable_blocks`)
    rather than by `create_block_mask`: no compile (on a fresh machine, compiling create_block_mask took
    minutes of the first step) and no `[B, T, T]` tensor."""
    global _last_mask
    from torch.nn.attention.flex_attention import BlockMask

    key = (window, sinks, batch, length, device)
    if _last_mask and _last_mask[0] is positions and _last_mask[1] is real and _last_mask[2] == key:
        return _last_mask[3]
    positions_ = positions.expand(batch, length).long()
    real_ = torch.ones(batch, length, dtype=torch.bool, device=device) if real is None else real.bool()

    def visible(b, h, q_index, k_index):
        back = q_index - k_index
        same_document = (back >= 0) & (back == positions_[b, q_index] - positions_[b, k_index])
        in_reach = (positions_[b, k_index] < sinks) | (back < window)
        return (back == 0) | (real_[b, k_index] & same_document & in_reach)

    reach = _reachable_blocks(positions_, window, sinks, length)
    counts = reach.sum(-1, dtype=torch.int32)
    indices = torch.argsort((~reach).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    mask = BlockMask.from_kv_blocks(counts, indices, BLOCK_SIZE=BLOCK, mask_mod=visible, seq_lengths=(length, length))
    _last_mask = (positions, real, key, mask)
    return mask


def flex_window_attention(q, k, v, *, positions, real=None, window: int, sinks: int, scale: float) -> torch.Tensor:
    """Same arguments and result as `naive_window_attention`; q `[B,T,HQ,D]`, k/v `[B,T,H,D]`."""
    from torch.nn.attention.flex_attention import flex_attention

    batch, length = q.shape[:2]
    block_mask = _block_mask(positions, real, window, sinks, batch, length, q.device)
    attend = _compiled_flex() if q.is_cuda else flex_attention
    out = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=block_mask, scale=scale,
                 enable_gqa=True)
    return out.transpose(1, 2)
