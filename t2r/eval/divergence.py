"""KL to the source by position: how far each contender's next-token distribution is from the source's.

    KL_t = sum_v p_t(v) (log p_t(v) - log q_t(v)),   p: the source (the reference), q: the contender

per predicted token, pooled over the same position buckets as perplexity (`t2r.eval.perplexity`). Perplexity
can flatter a student on its own training corpus (a next-token loss adapts it to the text, so it may beat the
source there even where no state helps); KL to the source cannot: 0 is the best any model can do, the source
itself scores exactly 0, and a window of the source grows away from it as the dropped context matters more.
The windows' KL draws the frontier of this measure as their perplexity does (`t2r.eval.frontier`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .contenders import Contender
from .perplexity import bucket_edges
from .progress import Step
from .result_cache import NO_CACHE, ResultCache, digest


def token_kl(reference_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """`[B, T]` KL(softmax(reference) || softmax(logits)) per position (fp32), from `[B, T, V]` logits."""
    log_p = F.log_softmax(reference_logits.float(), -1)
    log_q = F.log_softmax(logits.float(), -1)
    return (log_p.exp() * (log_p - log_q)).sum(-1).clamp_min(0)  # >= 0; rounding can dip a hair below


def pool_kl_by_position(name: str, kl: torch.Tensor, edges: list[int] | None = None) -> dict:
    """`[N, T-1]` per-token KL (the token predicted at positions 1 .. T-1) -> {"name", "buckets": [{"start",
    "end", "tokens", "kl"}], "kl", "tokens"}: the mean KL per bucket and over every token."""
    length = kl.shape[1] + 1
    edges = edges or bucket_edges(length)
    positions = torch.arange(1, length)
    buckets = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        chosen = kl[:, (positions >= lo) & (positions < hi)]
        if chosen.numel():
            buckets.append({"start": lo, "end": hi, "tokens": chosen.numel(), "kl": chosen.double().mean().item()})
    mean = kl.double().mean().item() if kl.numel() else math.nan
    return {"name": name, "buckets": buckets, "kl": mean, "tokens": kl.numel()}


@torch.no_grad()
def position_kl(contenders: list[Contender], reference: Contender, ids: torch.Tensor, batch_size: int = 1,
                cache: ResultCache = NO_CACHE) -> list[dict]:
    """KL(reference || contender) by position for every contender (the reference itself included: 0), on the
    rows `ids` `[N, T]`. The reference runs once per batch for all contenders whose scores are not stored;
    contenders with a fingerprint (the baseline's windows) are read from / stored in `cache`."""
    inputs = {"ids": digest(ids), "batch_size": batch_size, "reference": reference.fingerprint}
    stored, todo = {}, []
    for c in contenders:
        parts = None
        if cache.enabled and c.fingerprint is not None and reference.fingerprint is not None:
            parts = cache.key_parts(c.fingerprint, "kl", inputs, dtype=c.dtype, device=c.device, window=c.window,
                                    sinks=c.sinks)
            value = cache.get(parts)
            if value is not None:
                cache.hits += 1
                stored[c.name] = {**value, "name": c.name}
                continue
        todo.append((c, parts))
    if todo:
        per_token = {c.name: [] for c, _ in todo}
        with Step(f"kl to {reference.name}"):
            for start in range(0, len(ids), batch_size):
                batch = ids[start:start + batch_size]
                reference_logits = reference.logits(batch)[:, :-1]
                for c, _ in todo:
                    logits = reference_logits if c is reference else c.logits(batch)[:, :-1]
                    per_token[c.name].append(token_kl(reference_logits, logits.to(reference_logits.device)).cpu())
        for c, parts in todo:
            value = pool_kl_by_position(c.name, torch.cat(per_token[c.name]))
            if parts is not None:
                cache.misses += 1
                cache.put(parts, value)
            stored[c.name] = value
    return [stored[c.name] for c in contenders]
