"""Source adapters: one entry per source architecture that t2r converts, in one registry.

An adapter names the converted classes of a source (each subclasses the source's own class, so parameter
names and the decoder layers stay the source's) and holds every way a source differs that t2r must know of.

What every converted layer reads from the source attention itself, whatever the source (`ConvertedAttention`):
- q/k/v: separate `q_proj`, `k_proj`, `v_proj`, or Phi-3's fused `qkv_proj` (q | k | v), kept under the
  source's names (`t2r.layers.base.ATTENTION_PROJECTIONS`);
- RoPE over the whole head, or the first channels only (Phi-3's `partial_rotary_factor`): the width of the
  source's own cos/sin says which (`apply_rope`);
- q/k norms: the source attention's per-head `q_norm` / `k_norm` modules when it has them (Qwen3, Gemma 3),
  applied where the source applies them, before the feature map and RoPE;
- the softmax scale: the source attention's `scaling` (Gemma 3: `query_pre_attn_scalar ** -0.5`);
- embedding scale: the source's own `embed_tokens` module (Gemma 3 scales by sqrt(hidden) inside it).

What differs per source, on its adapter:
- sliding layers: `layer_types` from the source config, or, for configs without it (Mistral), every layer
  slides when `sliding_window` is set;
- RoPE per layer type (Gemma 3: local and global bases): `rotary_per_layer_type`;
- whether recurrent layers are marked in the config's `layer_types`: `marks_recurrent_layers`;
- what cannot be converted yet: `unsupported(config)` names it (Gemma 3's attention logit soft-capping,
  bidirectional attention).

Adding a source: its config class in `configuration.py`, its base model and causal LM classes in `modeling.py`
(empty subclasses but for their `config` annotation), one `SourceAdapter` below (or `register_source` in your
own code), and one row of `TINY_SOURCES` in `tests/helpers/models.py`.

This module imports no model code: the adapters name their classes, imported on first use, so that the
configuration and modeling modules can read their adapter.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

T2R_PREFIX = "t2r_"
"""A converted config's `model_type` is the source's with this prefix (`t2r_llama`)."""
_DEFAULT_MODULES = {"config": "t2r.models.configuration", "base_model": "t2r.models.modeling",
                    "causal_lm": "t2r.models.modeling"}


def _nothing_unsupported(config) -> str | None:
    return None


@dataclass(frozen=True)
class SourceAdapter:
    """How one source architecture converts."""

    model_type: str
    """The source config's `model_type` (`llama`); the converted one is `t2r_llama`."""
    config: str | type
    """The converted config class (subclasses the source config): a class, a name in `t2r.models.configuration`,
    or `"module:Class"`; imported on first use of `config_class`."""
    base_model: str | type
    """The converted base model class (subclasses the source base model): a class, a name in
    `t2r.models.modeling`, or `"module:Class"`."""
    causal_lm: str | type
    """The converted causal LM class (subclasses the source causal LM), as `base_model`."""
    unsupported: Callable[[object], str | None] = _nothing_unsupported
    """What in this source config t2r cannot convert yet (a message), or None."""
    rotary_per_layer_type: bool = False
    """The source's rotary embedding differs per layer type and is called with it (Gemma 3: base 10k for sliding
    layers, 1M for global ones); a converted FoX layer keeps its source's."""
    marks_recurrent_layers: bool = True
    """Mark constant-memory layers `linear_attention` in the config's `layer_types`; off where the source keys
    more on its own layer types (Gemma 3: one rotary embedding per type, and its config check refuses others)."""

    def _resolve(self, field: str) -> type:
        value = getattr(self, field)
        if isinstance(value, type):
            return value
        module, _, name = value.rpartition(":")
        return getattr(importlib.import_module(module or _DEFAULT_MODULES[field]), name)

    @property
    def config_class(self) -> type:
        return self._resolve("config")

    @property
    def model_class(self) -> type:
        return self._resolve("base_model")

    @property
    def causal_lm_class(self) -> type:
        return self._resolve("causal_lm")

    @property
    def classes(self) -> tuple[type, type, type]:
        """The converted (config, base model, causal LM) classes."""
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


ARCHITECTURES: dict[str, SourceAdapter] = {adapter.model_type: adapter for adapter in (
    SourceAdapter("llama", "T2RLlamaConfig", "T2RLlamaModel", "T2RLlamaForCausalLM"),
    SourceAdapter("mistral", "T2RMistralConfig", "T2RMistralModel", "T2RMistralForCausalLM"),
    SourceAdapter("qwen2", "T2RQwen2Config", "T2RQwen2Model", "T2RQwen2ForCausalLM"),
    SourceAdapter("qwen3", "T2RQwen3Config", "T2RQwen3Model", "T2RQwen3ForCausalLM"),
    SourceAdapter("phi3", "T2RPhi3Config", "T2RPhi3Model", "T2RPhi3ForCausalLM"),
    SourceAdapter("gemma3_text", "T2RGemma3TextConfig", "T2RGemma3TextModel", "T2RGemma3ForCausalLM",
                  unsupported=_gemma3_unsupported, rotary_per_layer_type=True, marks_recurrent_layers=False),
)}
"""Source architectures that can be converted, keyed by the source config's `model_type`; `t2r.models`
registers their converted classes with transformers' Auto classes."""


def register_source(adapter: SourceAdapter) -> SourceAdapter:
    """Add a source architecture and register its converted classes with transformers' Auto classes, so that
    a converted model saved with `save_pretrained` loads back through `AutoModelForCausalLM`."""
    if adapter.model_type in ARCHITECTURES:
        raise ValueError(f"a source named {adapter.model_type!r} is already registered")
    config_class = adapter.config_class
    if config_class.model_type != T2R_PREFIX + adapter.model_type:
        raise ValueError(f"{config_class.__name__}.model_type is {config_class.model_type!r}; a converted "
                         f"{adapter.model_type} config must be {T2R_PREFIX + adapter.model_type!r}")
    ARCHITECTURES[adapter.model_type] = adapter
    register_auto_classes(adapter)
    return adapter


def unregister_source(model_type: str) -> None:
    """Remove a source added by `register_source` (transformers keeps its Auto registrations)."""
    get_source(model_type)
    del ARCHITECTURES[model_type]


def register_auto_classes(adapter: SourceAdapter) -> None:
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    config_class, model_class, causal_lm_class = adapter.classes
    AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
    AutoModel.register(config_class, model_class, exist_ok=True)
    AutoModelForCausalLM.register(config_class, causal_lm_class, exist_ok=True)


def get_source(model_type: str) -> SourceAdapter:
    """The adapter of a source `model_type` (`llama`) or of a converted one (`t2r_llama`)."""
    try:
        return ARCHITECTURES[model_type.removeprefix(T2R_PREFIX)]
    except KeyError:
        raise ValueError(f"unknown source architecture {model_type!r}: t2r converts {', '.join(ARCHITECTURES)} "
                         "(register another with t2r.models.register_source)") from None
