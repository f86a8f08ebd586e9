"""Source adapters: one entry per source architecture that t2r converts, in one registry.

An adapter names the converted classes of a source (each subclasses the source's own class, so parameter
names and the decoder layers stay the source's) and says what differs between sources around attention:

- q/k/v: separate `q_proj`, `k_proj`, `v_proj`, or Phi-3's fused `qkv_proj` (q | k | v), kept under the
  source's names (`ConvertedAttention.project`);
- RoPE over the whole head, or the first channels only (Phi-3's `partial_rotary_factor`): the width of the
  source's own cos/sin says which (`apply_rope`);
- q/k norms: a converted layer reuses the source attention's per-head `q_norm` / `k_norm` modules when it has
  them (Qwen3, Gemma 3), applied where the source applies them, before the feature map and RoPE;
- the softmax scale: the source attention's `scaling` (Gemma 3: `query_pre_attn_scalar ** -0.5`);
- embedding scale: the source's own `embed_tokens` module (Gemma 3 scales by sqrt(hidden) inside it);
- RoPE per layer type (Gemma 3: local and global bases): `T2RModelMixin.position_embeddings_by_type`;
- sliding layers: `layer_types` from the source config, or, for configs without it (Mistral), every layer
  slides when `sliding_window` is set;
- what cannot be converted yet: `unsupported(config)` names it (Gemma 3's attention logit soft-capping,
  bidirectional attention).

Adding a source: its config class in `configuration.py`, its base and causal LM classes in `modeling.py`,
and one `SourceAdapter` line in `ARCHITECTURES` below.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from t2r.models.configuration import (
    T2RGemma3TextConfig, T2RLlamaConfig, T2RMistralConfig, T2RPhi3Config, T2RQwen2Config, T2RQwen3Config,
)
from t2r.models.modeling import (
    T2RGemma3ForCausalLM, T2RGemma3TextModel, T2RLlamaForCausalLM, T2RLlamaModel, T2RMistralForCausalLM,
    T2RMistralModel, T2RPhi3ForCausalLM, T2RPhi3Model, T2RQwen2ForCausalLM, T2RQwen2Model, T2RQwen3ForCausalLM,
    T2RQwen3Model,
)


class SourceAdapter(NamedTuple):
    """How one source architecture converts."""

    config_class: type
    """Converted config; subclasses the source config."""
    model_class: type
    """Converted base model; subclasses the source base model."""
    causal_lm_class: type
    """Converted causal LM; subclasses the source causal LM."""
    unsupported: Callable[[object], str | None] = lambda config: None
    """What in this source config t2r cannot convert yet (a message), or None."""

    @property
    def classes(self) -> tuple[type, type, type]:
        return self.config_class, self.model_class, self.causal_lm_class

    @property
    def source_classes(self) -> tuple[type, type, type]:
        """The source's own (config, base model, causal LM) classes."""
        return tuple(next(base for base in cls.__bases__ if not base.__name__.startswith("T2R"))
                     for cls in self.classes)

    @staticmethod
    def layer_types(config) -> list[str]:
        """The source's attention kind per layer: `full_attention` or `sliding_attention`."""
        if getattr(config, "layer_types", None):
            return list(config.layer_types)
        sliding = getattr(config, "sliding_window", None) is not None
        return ["sliding_attention" if sliding else "full_attention"] * config.num_hidden_layers


def _gemma3_unsupported(config) -> str | None:
    if getattr(config, "attn_logit_softcapping", None) is not None:
        return "attention logit soft-capping (attn_logit_softcapping) has no recurrent counterpart"
    if getattr(config, "use_bidirectional_attention", False):
        return "bidirectional attention (use_bidirectional_attention) is not causal"
    return None


ARCHITECTURES: dict[str, SourceAdapter] = {
    # source model_type: adapter
    "llama": SourceAdapter(T2RLlamaConfig, T2RLlamaModel, T2RLlamaForCausalLM),
    "mistral": SourceAdapter(T2RMistralConfig, T2RMistralModel, T2RMistralForCausalLM),
    "qwen2": SourceAdapter(T2RQwen2Config, T2RQwen2Model, T2RQwen2ForCausalLM),
    "qwen3": SourceAdapter(T2RQwen3Config, T2RQwen3Model, T2RQwen3ForCausalLM),
    "phi3": SourceAdapter(T2RPhi3Config, T2RPhi3Model, T2RPhi3ForCausalLM),
    "gemma3_text": SourceAdapter(T2RGemma3TextConfig, T2RGemma3TextModel, T2RGemma3ForCausalLM, _gemma3_unsupported),
}
"""Source architectures that can be converted, keyed by the source config's `model_type`."""
