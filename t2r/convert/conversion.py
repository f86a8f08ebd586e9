"""`convert(model, target)`: swap softmax attention for a recurrent mixer, keeping every source weight.

The converted model is built by the same path that loads a saved source checkpoint into a t2r class
(`from_pretrained(config=<t2r config>, state_dict=...)`): source parameters load unchanged by name and
only the new gate parameters are initialised (see `t2r.layers` for how each starts).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel
from transformers.utils import logging as hf_logging

from t2r.convert.layer_spec import compact_ranges, parse_layers
from t2r.layers import resolve_options
from t2r.models import ARCHITECTURES
from t2r.models.configuration import T2RConfigMixin
from t2r.models.generation_cache import generation_memory

_DROPPED_CONFIG_KEYS = ("model_type", "architectures", "transformers_version", "quantization_config", "auto_map")


def check_convertible(config) -> None:
    """Raise a ValueError naming the problem if `config` cannot be converted."""
    if isinstance(config, T2RConfigMixin):
        raise ValueError(f"this model is already converted ({config.model_type}); convert the source model instead")
    model_type = getattr(config, "model_type", None)
    if model_type not in ARCHITECTURES:
        raise ValueError(
            f"unsupported architecture {model_type!r}: t2r converts {', '.join(ARCHITECTURES)} models "
            "(decoder-only, rotary embeddings, q/k/v (or fused qkv) and o projections)"
        )
    problem = ARCHITECTURES[model_type].unsupported(config)
    if problem:
        raise ValueError(f"{model_type}: {problem}; t2r cannot convert this model yet")
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads or config.num_attention_heads
    if heads % kv_heads:
        raise ValueError(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    if head_dim * heads != config.hidden_size and getattr(config, "head_dim", None) is None:
        raise ValueError(
            f"hidden_size={config.hidden_size} is not divisible by num_attention_heads={heads}; set head_dim explicitly"
        )
    if head_dim % 2:
        raise ValueError(f"head_dim={head_dim} must be even for rotary embeddings")


def t2r_config(config, target: str, layers=None, source: str | None = None, layer_options: dict | None = None,
               **options):
    """The converted config for a source config: same fields, plus which layers run which mixer (and, in
    `layer_options`, `{layer index: {option: value}}` for layers whose options differ from `options`)."""
    resolved = resolve_options(target, **options)  # an unknown target or option fails here, first
    check_convertible(config)
    converted = set(parse_layers(layers, config.num_hidden_layers))
    fields = {k: v for k, v in config.to_dict().items() if k not in _DROPPED_CONFIG_KEYS}
    adapter = ARCHITECTURES[config.model_type]
    fields.update(
        layer_types=adapter.layer_types(config),
        t2r_mixers=[target if i in converted else "softmax" for i in range(config.num_hidden_layers)],
        t2r_options={target: resolved.to_dict()},
        t2r_layer_options={str(k): dict(v) for k, v in (layer_options or {}).items()} or None,
        t2r_source=source or getattr(config, "name_or_path", None) or None,
    )
    return adapter.config_class(**fields)


@dataclass
class ConversionReport:
    """What `convert` changed: printed by the CLI, useful in notebooks."""

    model_type: str
    target: str
    converted_layers: list[int]
    num_layers: int
    source_parameters: int
    added_parameters: int
    state_bytes: int
    """Generation cache per sequence that does not grow (recurrent states)."""
    cache_bytes_per_token: int
    """Generation cache per sequence and token (K/V of softmax and FoX layers), in the model's dtype."""
    source_cache_bytes_per_token: int

    def __str__(self) -> str:
        share = 100 * self.added_parameters / max(self.source_parameters, 1)
        return (
            f"{self.model_type}: {len(self.converted_layers)}/{self.num_layers} layers -> {self.target} "
            f"(layers {compact_ranges(self.converted_layers)})\n"
            f"parameters: source {self.source_parameters:,}, added {self.added_parameters:,} ({share:.3f}%)\n"
            f"generation cache per sequence: {self.state_bytes / 2**20:,.2f} MiB fixed"
            f" + {self.cache_bytes_per_token / 2**10:,.1f} KiB per token"
            f" (source: {self.source_cache_bytes_per_token / 2**10:,.1f} KiB per token)"
        )


def count_parameters(model: torch.nn.Module) -> int:
    """Unique parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


@contextmanager
def quiet_loading():
    """Silence the load report and progress bar: missing gate parameters are expected here."""
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:  # left off when the caller turned them off (t2r.outputs.quiet_libraries)
            hf_logging.enable_progress_bar()


def convert(model: PreTrainedModel, target: str, *, layers=None, source: str | None = None,
            lookback=None, copy: bool = True, layer_options: dict | None = None, **options) -> PreTrainedModel:
    """Return a converted copy of `model` whose selected layers run `target` instead of softmax attention.

    Args:
        model: a loaded Llama, Mistral, Qwen2, Qwen3, Phi-3 or Gemma 3 text causal LM (`t2r.ARCHITECTURES`;
            hub, local or GGUF; any dtype and device).
        target: a registered mixer (`t2r.MIXERS`, the built-in ones or one of your own).
        layers: which layers to convert (None = all; ints or a string like "0-11", `t2r.convert.layer_spec`); the
            rest stay softmax. `auto:N` is resolved by `calibrated_convert`, which ranks the layers first.
        source: where `model` came from (hub id, directory, file.gguf or "smollm2"), recorded in the config
            (`t2r_source`) as the default baseline of `t2r eval`; default: the model's `name_or_path`.
        lookback: `[layers, query heads]` look-back of the source's attention (`t2r.convert.lookback`): each
            converted layer's forget gate starts at the matching decay (`init="teacher"`; targets with
            `MixerSpec.teacher_init`: gla, fox).
        layer_options: `{layer index: {option: value}}` for converted layers whose options differ from
            `options` (`calibrated_convert`'s `kept_window` gives the layers it keeps a longer window this way).
        copy: False reuses the source's tensors instead of copying them: the new gates are the only new memory,
            and the two models share their weights from then on (training one changes the other). For a source
            that is not used afterwards (`t2r convert`; finetuning without a teacher in the same dtype).
        **options: fields of the target's options (`t2r.MIXERS[target].options`: feature_map, rope, num_slots...).
    With `copy=True` the source model is left untouched and the result shares no storage with it.
    """
    config = t2r_config(model.config, target, layers, source=source, layer_options=layer_options, **options)
    causal_lm_class = ARCHITECTURES[model.config.model_type].causal_lm_class
    param = next(model.parameters())
    state_dict = {k: v.detach().clone() if copy else v for k, v in model.state_dict().items()}
    with quiet_loading():
        converted = causal_lm_class.from_pretrained(None, config=config, state_dict=state_dict, dtype=param.dtype)
    if getattr(model, "generation_config", None) is not None:
        converted.generation_config = model.generation_config
    converted.config.name_or_path = model.config.name_or_path  # provenance: which source it came from
    if lookback is not None:
        for index, attention in converted.converted_layers().items():
            attention.init_from_lookback(lookback[index])
    return converted.to(param.device).train(model.training)


def conversion_report(source: PreTrainedModel, converted: PreTrainedModel) -> ConversionReport:
    mixers = converted.config.t2r_mixers
    targets = sorted(set(mixers) - {"softmax"})
    element_size = next(converted.parameters()).element_size()
    state_bytes, per_token = generation_memory(converted.config, element_size)
    source_per_token = generation_memory(source.config, element_size)[1]
    return ConversionReport(
        model_type=source.config.model_type,
        target="+".join(targets),
        converted_layers=[i for i, m in enumerate(mixers) if m != "softmax"],
        num_layers=len(mixers),
        source_parameters=count_parameters(source),
        added_parameters=count_parameters(converted) - count_parameters(source),
        state_bytes=state_bytes,
        cache_bytes_per_token=per_token,
        source_cache_bytes_per_token=source_per_token,
    )
