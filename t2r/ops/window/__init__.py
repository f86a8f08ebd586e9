"""Sliding-window + sink softmax attention over one call's tokens, and over cached keys for decoding.

The exact-softmax part of a converted layer with `window` / `sinks` (`t2r.layers.window`): each query reads
its document's first `sinks` tokens and its `window` most recent ones. `naive.py` writes the visibility rule
out; `chunk.py` computes the same in blocks, linear in the length, in plain PyTorch (any device);
`triton_window.py` runs it as Triton kernels (a band per query block plus gathered sinks, fwd and bwd), used on
CUDA for bf16/fp16; `flex.py` hands the rule to FlexAttention (`T2R_WINDOW_BACKEND=chunk|triton|flex` overrides
the choice).
"""

import os

from ..backend import use_triton
from .chunk import chunk_window_attention
from .flex import flex_window_attention
from .naive import masked_window_attention, naive_window_attention, visible_keys

BACKENDS = ("auto", "chunk", "triton", "flex")


def window_attention(q, k, v, *, positions, real=None, window: int, sinks: int, scale: float, block: int = 64):
    """q `[B,T,HQ,D]`, k/v `[B,T,H,D]`, positions `[B,T]` inside each document, real `[B,T]` (None: no padding)."""
    if window < 1 or sinks < 0:
        raise ValueError(f"window must be >= 1 and sinks >= 0, got window={window}, sinks={sinks}")
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"query heads ({q.shape[2]}) must be a multiple of kv heads ({k.shape[2]})")
    choice = os.environ.get("T2R_WINDOW_BACKEND", "auto")
    if choice not in BACKENDS:
        raise ValueError(f"T2R_WINDOW_BACKEND={choice!r}: choose one of {', '.join(BACKENDS)}")
    # auto: the Triton kernels on CUDA in half precision, training and inference alike (no mask to build, no
    # recompile for a new length or document count: benchmarks/results/profile_distill_*.md); the blocked
    # PyTorch form elsewhere
    if choice == "triton" or (choice == "auto" and use_triton(q, k, v)):
        from .triton_window import triton_window_attention  # lazy: CPU-only installs never import triton

        return triton_window_attention(q, k, v, positions=positions, real=real, window=window, sinks=sinks,
                                       scale=scale)
    if choice == "flex":
        return flex_window_attention(q, k, v, positions=positions, real=real, window=window, sinks=sinks, scale=scale)
    return chunk_window_attention(q, k, v, positions=positions, real=real, window=window, sinks=sinks, scale=scale,
                                  block=block)


__all__ = ["window_attention", "chunk_window_attention", "flex_window_attention", "naive_window_attention",
           "masked_window_attention", "visible_keys"]
