"""What an evaluation compares: models, and training-free window baselines built from a softmax model.

A `Contender` is anything that maps token ids to next-token logits: a (converted or source) model, or a
softmax model restricted to a sliding window of W recent tokens plus S "attention sink" tokens at the
start of the sequence (StreamingLLM's cache; the window half of LoLCATs / Lizard / LoLA). The window rows
answer the question a converted model must beat: does its state remember more than a KV cache of the same
size would?
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from t2r.layers import get_mixer
from t2r.models.generation_cache import generation_memory


@dataclass
class Contender:
    """A named model to score; `window`/`sinks` restrict a softmax model's attention (None = full)."""

    name: str
    model: torch.nn.Module
    window: int | None = None
    sinks: int = 0
    role: str = "model"
    """model | baseline | window | student: how reports label and colour the row."""
    fingerprint: str | None = None
    """The weights' fingerprint (`t2r.eval.result_cache`) when this contender's scores may be stored and reused
    (the baseline and its windows); None: always scored."""

    def __post_init__(self):
        if self.window is not None:
            if self.window < 1 or self.sinks < 0:
                raise ValueError(f"a window needs window >= 1 and sinks >= 0, got window={self.window}, "
                                 f"sinks={self.sinks}")
            mixers = getattr(self.model.config, "t2r_mixers", None)
            if mixers and any(m != "softmax" for m in mixers):
                raise ValueError(f"{self.name}: window baselines are built from a softmax model, not a converted one")

    @torch.no_grad()
    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Next-token logits `[B, T, V]` (fp32) for right-padded or unpadded rows; causal, so padding after a
        position never changes it."""
        input_ids = input_ids.to(self.device)
        mask = None
        if self.window is not None:
            mask = window_sink_mask(input_ids.shape[1], self.window, self.sinks, self.dtype, self.device)
        return self.model(input_ids=input_ids, attention_mask=mask, use_cache=False).logits.float()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def max_length(self) -> int | None:
        """Longest sequence the model was built for (None for an all-recurrent model, which has no limit)."""
        return length_limit(self.model.config)


def length_limit(config, mixers: list[str] | None = None) -> int | None:
    """Longest sequence a model of `config` (with these `t2r_mixers`, default the config's) was built for; None for
    an all-recurrent model, which has no limit."""
    mixers = mixers if mixers is not None else getattr(config, "t2r_mixers", None)
    if mixers and all(m != "softmax" and get_mixer(m).constant_memory for m in mixers):
        return None
    return getattr(config, "max_position_embeddings", None)


def window_sink_mask(length: int, window: int, sinks: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Additive mask `[1, 1, T, T]`: query i sees key j iff j <= i and (i - j < window or j < sinks)."""
    i = torch.arange(length, device=device)[:, None]
    j = torch.arange(length, device=device)[None, :]
    visible = (j <= i) & ((i - j < window) | (j < sinks))
    mask = torch.zeros(length, length, dtype=dtype, device=device)
    return mask.masked_fill_(~visible, torch.finfo(dtype).min)[None, None]


def memory_matched_window(model_config, baseline_config, length: int, sinks: int, element_size: int) -> int | None:
    """The window W whose KV cache (W + sinks tokens of the baseline) takes as many bytes as the model's
    generation cache after `length` tokens; None when the model keeps a growing KV cache in every layer."""
    fixed, per_token = generation_memory(model_config, element_size)
    baseline_per_token = generation_memory(baseline_config, element_size)[1]
    if fixed == 0:
        return None
    tokens = (fixed + per_token * length) // baseline_per_token
    return max(int(tokens) - sinks, 1)
