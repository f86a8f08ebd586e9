"""Sliding-window + sink attention through PyTorch's FlexAttention: the visibility rule of `naive.py` as a
`mask_mod`, so one fused kernel skips the blocks it hides (compiled on CUDA; eager elsewhere, for tests)."""

import functools

import torch


@functools.lru_cache(maxsize=1)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def flex_window_attention(q, k, v, *, positions, real=None, window: int, sinks: int, scale: float) -> torch.Tensor:
    """Same arguments and result as `naive_window_attention`; q `[B,T,HQ,D]`, k/v `[B,T,H,D]`."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    batch, length = q.shape[:2]
    positions = positions.expand(batch, length).long()
    real = torch.ones(batch, length, dtype=torch.bool, device=q.device) if real is None else real.bool()

    def visible(b, h, q_index, k_index):
        back = q_index - k_index
        same_document = (back >= 0) & (back == positions[b, q_index] - positions[b, k_index])
        in_reach = (positions[b, k_index] < sinks) | (back < window)
        return (back == 0) | (real[b, k_index] & same_document & in_reach)

    on_cuda = q.is_cuda
    block_mask = create_block_mask(visible, batch, None, length, length, device=q.device, _compile=on_cuda)
    attend = _compiled_flex() if on_cuda else flex_attention
    out = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=block_mask, scale=scale,
                 enable_gqa=True)
    return out.transpose(1, 2)
