"""Perplexity by position: where in a long document a converted model loses track.

Each row of held-out text (a document's first L tokens, or the documents packed end to end) is scored in
one forward; token NLL is pooled per position bucket (0-64, 64-256, 256-1K, ...) and overall. A recurrent
model that matches its source early but drifts late is forgetting; one that does no better than a window
of the same memory late in the sequence has learned nothing a window would not give.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from t2r.data.rows import token_rows  # noqa: F401  (the rows `evaluate` scores: perplexity.token_rows)

from .contenders import Contender
from .progress import Step
from .result_cache import NO_CACHE, ResultCache, digest

BUCKET_EDGES = (0, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


@dataclass
class PositionPerplexity:
    """Mean token NLL (nats) and perplexity per position bucket, and over all scored tokens."""

    name: str
    buckets: list[dict] = field(default_factory=list)
    """{"start", "end", "tokens", "nll", "ppl"} per bucket; positions are those of the predicted token."""
    nll: float = float("nan")
    ppl: float = float("nan")
    tokens: int = 0

    def to_dict(self) -> dict:
        return {"name": self.name, "buckets": self.buckets, "nll": self.nll, "ppl": self.ppl, "tokens": self.tokens}


def bucket_edges(length: int) -> list[int]:
    """The standard edges up to `length` (the last bucket ends at `length`)."""
    edges = [e for e in BUCKET_EDGES if e < length]
    return edges + [length]


@torch.no_grad()
def token_nll(contender: Contender, ids: torch.Tensor, batch_size: int = 1, progress: bool = True) -> torch.Tensor:
    """`[N, T-1]` NLL of token t+1 given tokens <= t, for every row of `ids` `[N, T]` (fp32, on CPU)."""
    out = []
    for start in tqdm(range(0, len(ids), batch_size), desc=f"ppl {contender.name}",
                      disable=None if progress else True, leave=False):  # None: no bar off a terminal
        batch = ids[start:start + batch_size]
        logits = contender.logits(batch)[:, :-1]
        target = batch[:, 1:].to(logits.device)
        nll = F.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="none").view_as(target)
        out.append(nll.cpu())
    return torch.cat(out)


def pool_by_position(name: str, nll: torch.Tensor, edges: list[int] | None = None) -> PositionPerplexity:
    """Pool `[N, T-1]` NLL into buckets of the predicted token's position (1 .. T-1) and overall."""
    length = nll.shape[1] + 1
    edges = edges or bucket_edges(length)
    positions = torch.arange(1, length)
    result = PositionPerplexity(name=name, tokens=nll.numel())
    for lo, hi in zip(edges[:-1], edges[1:]):
        chosen = nll[:, (positions >= lo) & (positions < hi)]
        if chosen.numel():
            mean = chosen.double().mean().item()
            result.buckets.append({"start": lo, "end": hi, "tokens": chosen.numel(), "nll": mean,
                                   "ppl": math.exp(min(mean, 50))})
    result.nll = nll.double().mean().item()
    result.ppl = math.exp(min(result.nll, 50))
    return result


def position_perplexity(contenders: list[Contender], ids: torch.Tensor, batch_size: int = 1,
                        progress: bool = True, cache: ResultCache = NO_CACHE) -> list[PositionPerplexity]:
    """Every contender scored on the same rows, pooled over the same buckets (read from `cache` when stored)."""
    inputs = {"ids": digest(ids), "batch_size": batch_size}
    results = []
    for c in contenders:
        with Step(f"ppl {c.name}"):
            stored = cache.score(c, "ppl", inputs, lambda c=c: pool_by_position(c.name, token_nll(c, ids, batch_size,
                                                                                                progress)).to_dict())
        results.append(PositionPerplexity(**{**stored, "name": c.name}))
    return results
