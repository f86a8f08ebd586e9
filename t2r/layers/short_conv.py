"""A short causal depthwise convolution over time, with a fixed-size cache for decoding.

y_t[c] = sum_{j=0..W-1} w[c, j] x_{t-W+1+j}[c]: each channel mixes its last W inputs (W = 4 in Mamba and
Gated DeltaNet, which apply it to q/k/v before the mixer). Tokens before a sequence's start read the cache
(the last W-1 inputs of the previous call), or zero; with `cu_seqlens` no tap crosses a document boundary.
`causal_conv_reference` is the obvious per-document loop the tests compare against.
"""

from __future__ import annotations

import itertools

import torch
from torch import nn
from transformers import initialization as init


def causal_conv(x: torch.Tensor, weight: torch.Tensor, cache: torch.Tensor | None = None,
                cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x `[B, T, C]`, weight `[C, W]` (column W-1 multiplies the current token), cache `[N, W-1, C]` (N = B, or
    the number of documents with `cu_seqlens` `[N + 1]`, B = 1). Returns y `[B, T, C]` in x's dtype and the new
    cache `[N, W-1, C]`: each sequence's last W-1 inputs, reaching into the old cache (or zeros) when T < W-1."""
    width = weight.shape[1]
    weight = weight.to(x.dtype)
    if cu_seqlens is None:
        prefix = cache.to(x.dtype) if cache is not None else x.new_zeros(x.shape[0], width - 1, x.shape[2])
        extended = torch.cat([prefix, x], 1)  # [B, W-1+T, C]
        y = sum(extended[:, j:j + x.shape[1]] * weight[:, j] for j in range(width))
        return y, extended[:, x.shape[1]:]
    if x.shape[0] != 1:
        raise ValueError("causal_conv with cu_seqlens needs batch size 1 (sequences packed along time), "
                         f"got {x.shape[0]}")
    length, starts, ends = x.shape[1], cu_seqlens[:-1].long(), cu_seqlens[1:].long()
    steps = torch.arange(length, device=x.device)
    document = torch.searchsorted(ends, steps, right=True).clamp(max=len(ends) - 1)  # no host sync
    frames = x[0]
    history = cache.to(x.dtype) if cache is not None else x.new_zeros(len(starts), width - 1, x.shape[2])

    def lagged(lag: torch.Tensor, position: torch.Tensor, doc: torch.Tensor, doc_start: torch.Tensor):
        """The input `lag` steps before `position` (of document `doc`), from the cache before its start."""
        inside = frames[(position - lag).clamp(min=0)]
        before = history[doc, (width - 1 + position - lag - doc_start).clamp(0, width - 2)]
        return torch.where((position - lag >= doc_start)[:, None], inside, before)

    y = sum(lagged(torch.tensor(width - 1 - j, device=x.device), steps, document, starts[document]) * weight[:, j]
            for j in range(width))
    # the new cache: positions end-W+1 .. end-1 of each document
    tail = ends[:, None] - (width - 1) + torch.arange(width - 1, device=x.device)  # [N, W-1]
    docs = torch.arange(len(starts), device=x.device)[:, None].expand_as(tail)
    new_cache = lagged(torch.zeros((), dtype=torch.long, device=x.device), tail.flatten(), docs.flatten(),
                       starts[docs.flatten()]).view(len(starts), width - 1, -1)
    return y[None], new_cache


def causal_conv_reference(x, weight, cache=None, cu_seqlens=None):
    """`causal_conv` one document and one token at a time (the tests' ground truth)."""
    width = weight.shape[1]
    bounds = cu_seqlens.tolist() if cu_seqlens is not None else None
    rows = ([(b, 0, x.shape[1]) for b in range(x.shape[0])] if bounds is None
            else [(0, s, e) for s, e in itertools.pairwise(bounds)])
    y, caches = torch.zeros_like(x), []
    for n, (b, start, end) in enumerate(rows):
        before = cache[n].to(x.dtype) if cache is not None else x.new_zeros(width - 1, x.shape[2])
        inputs = torch.cat([before, x[b, start:end]])  # this document's inputs, its W-1 predecessors first
        for t in range(start, end):
            taps = inputs[t - start:t - start + width]
            y[b, t] = sum(taps[j] * weight[:, j].to(x.dtype) for j in range(width))
        caches.append(inputs[len(inputs) - (width - 1):])
    return y, torch.stack(caches)


class ShortConvolution(nn.Module):
    """Depthwise causal convolution of `channels` channels, kernel `size`, starting as the identity (w[:, -1] = 1,
    the rest 0): a fresh conversion reads exactly the projections the source attention read."""

    def __init__(self, channels: int, size: int):
        super().__init__()
        self.size = size
        # an own parameter (not an nn.Conv1d child) so the deliberate init below is what loading runs
        self.weight = nn.Parameter(torch.empty(channels, size))

    def forward(self, x, cache=None, cu_seqlens=None):
        return causal_conv(x, self.weight, cache, cu_seqlens)

    def init_parameters(self, std: float) -> None:
        identity = torch.zeros(self.weight.shape)
        identity[:, -1] = 1.0
        init.copy_(self.weight, identity)

    def extra_repr(self) -> str:
        return f"channels={self.weight.shape[0]}, size={self.size}"
