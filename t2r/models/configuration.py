"""Configs of converted models: the source architecture's config plus which mixer each layer runs.

One config class per source architecture (transformers ignores registrations against its own config
classes, so these are ours), each a `@strict` dataclass so bad fields fail at construction, named by its
`SourceAdapter` (`t2r.models.architectures`), whose `model_type` it carries with the `t2r_` prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

from huggingface_hub.dataclasses import strict
from transformers import Gemma3TextConfig, LlamaConfig, MistralConfig, Phi3Config, Qwen2Config, Qwen3Config

from t2r.layers import MIXERS, MixerOptions, get_mixer
from t2r.models.architectures import get_source


@dataclass(kw_only=True)
class T2RConfigMixin:
    """Fields shared by every converted config.

    `layer_types` keeps transformers' vocabulary (`linear_attention` for recurrent layers, the source's
    `full_attention` / `sliding_attention` for softmax and FoX layers, unless the source's adapter says
    otherwise: `SourceAdapter.marks_recurrent_layers`); the mixer kind lives in `t2r_mixers` because transformers
    validates `layer_types` against a fixed list.
    """

    layer_types: list[str] | None = None
    t2r_mixers: list[str] | None = None
    """Per layer: a registered mixer (`t2r.layers.MIXERS`) or `softmax`."""
    t2r_options: dict | None = None
    """Per target (key), its resolved options (`MixerSpec.options`) as a dict."""
    t2r_layer_options: dict | None = None
    """Per converted layer (key: its index as a string), option fields that differ from its target's
    `t2r_options`: `{"7": {"window": 1024}}` (`convert.kept_window`). Absent for most models."""
    t2r_source: str | None = None
    """Where the source model came from (hub id, directory, file.gguf or `smollm2`): the default baseline of
    `t2r eval`."""

    def _fill_t2r_fields(self) -> None:
        n = self.num_hidden_layers
        if self.t2r_mixers is None:
            self.t2r_mixers = ["softmax"] * n
        if len(self.t2r_mixers) != n:
            raise ValueError(f"t2r_mixers has {len(self.t2r_mixers)} entries for {n} layers")
        bad = sorted({m for m in self.t2r_mixers if m not in MIXERS and m != "softmax"})
        if bad:
            raise ValueError(f"unknown mixer(s) {bad} in t2r_mixers; choose from {[*MIXERS, 'softmax']} "
                             "(a mixer of your own must be registered with t2r.layers.register_mixer before loading)")
        self.t2r_options = dict(self.t2r_options or {})
        for target in sorted(set(self.t2r_mixers) - {"softmax"}):
            saved = self.t2r_options.get(target, {})
            self.t2r_options[target] = get_mixer(target).options_from_config(saved).to_dict()
        self.t2r_layer_options = self._checked_layer_options(self.t2r_layer_options or {}) or None
        if self.layer_types is None:
            self.layer_types = ["full_attention"] * n
        if not get_source(self.model_type).marks_recurrent_layers:
            return
        self.layer_types = [
            "linear_attention" if mixer != "softmax" and get_mixer(mixer).constant_memory else
            ("full_attention" if layer_type == "linear_attention" else layer_type)
            for mixer, layer_type in zip(self.t2r_mixers, self.layer_types)
        ]

    def _checked_layer_options(self, given: dict) -> dict:
        """`t2r_layer_options` with string keys, each naming a converted layer whose options resolve."""
        checked = {}
        for key, overrides in given.items():
            index = int(key)
            if not 0 <= index < len(self.t2r_mixers) or self.t2r_mixers[index] == "softmax":
                raise ValueError(f"t2r_layer_options names layer {key}, which is not a converted layer")
            target = self.t2r_mixers[index]
            get_mixer(target).resolve_options(**{**self.t2r_options[target], **overrides})
            checked[str(index)] = dict(overrides)
        return checked

    def mixer_options(self, layer_idx: int) -> MixerOptions:
        """The options of converted layer `layer_idx`: its target's, with the layer's own overrides."""
        target = self.t2r_mixers[layer_idx]
        overrides = (self.t2r_layer_options or {}).get(str(layer_idx), {})
        return get_mixer(target).options(**{**self.t2r_options[target], **overrides})

    base_model_tp_plan = None  # gates and states are per kv head: tensor parallelism is not supported yet

    def __post_init__(self, **kwargs):
        self._fill_t2r_fields()
        super().__post_init__(**kwargs)


@strict
class T2RLlamaConfig(T2RConfigMixin, LlamaConfig):
    model_type = "t2r_llama"


@strict
class T2RMistralConfig(T2RConfigMixin, MistralConfig):
    model_type = "t2r_mistral"


@strict
class T2RQwen2Config(T2RConfigMixin, Qwen2Config):
    model_type = "t2r_qwen2"


@strict
class T2RQwen3Config(T2RConfigMixin, Qwen3Config):
    model_type = "t2r_qwen3"


@strict
class T2RPhi3Config(T2RConfigMixin, Phi3Config):
    model_type = "t2r_phi3"


@strict
class T2RGemma3TextConfig(T2RConfigMixin, Gemma3TextConfig):
    model_type = "t2r_gemma3_text"
