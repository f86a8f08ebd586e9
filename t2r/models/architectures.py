"""Source adapters: one entry per source architecture that t2r converts, in one registry.

An adapter names the converted classes of a source (each subclasses the source's own class, so parameter
names and the decoder layers stay the source's) and says what differs between sources around attention:

- q/k/v: read from separate `q_proj`, `k_proj`, `v_proj` (every source so far; a fused `qkv_proj` would need
  a rule in `ConvertedAttention.project`);
- q/k norms: a converted layer reuses the source attention's per-head `q_norm` / `k_norm` modules when it has
  them (Qwen3), applied where the source applies them, before the feature map and RoPE;
- sliding layers: `layer_types` from the source config, or, for configs without it (Mistral), every layer
  slides when `sliding_window` is set.

Adding a source: its config class in `configuration.py`, its base and causal LM classes in `modeling.py`,
and one `SourceAdapter` line in `ARCHITECTURES` below.
"""

from __future__ import annotations

from typing import NamedTuple

from t2r.models.configuration import T2RLlamaConfig, T2RMistralConfig, T2RQwen2Config, T2RQwen3Config
from t2r.models.modeling import (
    T2RLlamaForCausalLM, T2RLlamaModel, T2RMistralForCausalLM, T2RMistralModel, T2RQwen2ForCausalLM, T2RQwen2Model,
    T2RQwen3ForCausalLM, T2RQwen3Model,
)


class SourceAdapter(NamedTuple):
    """How one source architecture converts (a tuple: `config_class, model_class, causal_lm_class = adapter`)."""

    config_class: type
    """Converted config; subclasses the source config."""
    model_class: type
    """Converted base model; subclasses the source base model."""
    causal_lm_class: type
    """Converted causal LM; subclasses the source causal LM."""

    @property
    def source_classes(self) -> tuple[type, type, type]:
        """The source's own (config, base model, causal LM) classes."""
        return tuple(next(base for base in cls.__bases__ if not base.__name__.startswith("T2R"))
                     for cls in self)

    @staticmethod
    def layer_types(config) -> list[str]:
        """The source's attention kind per layer: `full_attention` or `sliding_attention`."""
        if getattr(config, "layer_types", None):
            return list(config.layer_types)
        sliding = getattr(config, "sliding_window", None) is not None
        return ["sliding_attention" if sliding else "full_attention"] * config.num_hidden_layers


ARCHITECTURES: dict[str, SourceAdapter] = {
    # source model_type: adapter
    "llama": SourceAdapter(T2RLlamaConfig, T2RLlamaModel, T2RLlamaForCausalLM),
    "mistral": SourceAdapter(T2RMistralConfig, T2RMistralModel, T2RMistralForCausalLM),
    "qwen2": SourceAdapter(T2RQwen2Config, T2RQwen2Model, T2RQwen2ForCausalLM),
    "qwen3": SourceAdapter(T2RQwen3Config, T2RQwen3Model, T2RQwen3ForCausalLM),
}
"""Source architectures that can be converted, keyed by the source config's `model_type`."""
