"""Sliding-window + sink softmax attention over one call's tokens, and over cached keys for decoding.

The exact-softmax part of a converted layer with `window` / `sinks` (`t2r.layers.window`): each query reads
its document's first `sinks` tokens and its `window` most recent ones. `naive.py` writes the visibility rule
out; `chunk.py` computes the same in blocks, linear in the length, in plain PyTorch (any device); `flex.py`
hands the rule to FlexAttention, one fused kernel on CUDA, used for training there (`T2R_WINDOW_BACKEND=chunk|flex`
overrides the choice).
"""

import os

import torch

from .chunk import chunk_window_attention
from .flex import flex_window_attention
from .naive import masked_window_attention, naive_window_attention, visible_keys


def window_attention(q, k, v, *, positions, real=None, window: int, sinks: int, scale: float, block: int = 64):
    """q `[B,T,HQ,D]`, k/v `[B,T,H,D]`, positions `[B,T]` inside each document, real `[B,T]` (None: no padding)."""
    if window < 1 or sinks < 0:
        raise ValueError(f"window must be >= 1 and sinks >= 0, got window={window}, sinks={sinks}")
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"query heads ({q.shape[2]}) must be a multiple of kv heads ({k.shape[2]})")
    choice = os.environ.get("T2R_WINDOW_BACKEND", "auto")
    if choice not in ("auto", "chunk", "flex"):
        raise ValueError(f"T2R_WINDOW_BACKEND={choice!r}: choose auto, chunk or flex")
    # auto: FlexAttention for training on CUDA (its backward is 6-20x faster, and training shapes are fixed, so
    # it compiles once); the blocked form for inference, whose forward is as fast and never recompiles for a new
    # length (prompts, evaluation rows)
    training = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if choice == "flex" or (choice == "auto" and training and q.is_cuda and q.dtype in (torch.bfloat16, torch.float16)):
        return flex_window_attention(q, k, v, positions=positions, real=real, window=window, sinks=sinks, scale=scale)
    return chunk_window_attention(q, k, v, positions=positions, real=real, window=window, sinks=sinks, scale=scale,
                                  block=block)


__all__ = ["window_attention", "chunk_window_attention", "flex_window_attention", "naive_window_attention",
           "masked_window_attention", "visible_keys"]
