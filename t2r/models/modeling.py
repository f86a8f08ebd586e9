"""Converted models: the source architecture's classes with some attention modules swapped.

Each converted class subclasses the source class (so parameter names stay
`model.layers.N.self_attn.q_proj.weight` and a source checkpoint loads unchanged), swaps the attention of
converted layers for a mixer from `t2r.layers`, and owns two things the source class cannot do for it:
a forward that hands each layer the mask it needs, and the recurrent-state cache for `generate()`.
"""

from functools import partial

import torch
from torch import nn
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextModel,
    LlamaForCausalLM,
    LlamaModel,
    MistralForCausalLM,
    MistralModel,
    Phi3ForCausalLM,
    Phi3Model,
    Qwen2ForCausalLM,
    Qwen2Model,
    Qwen3ForCausalLM,
    Qwen3Model,
)
from transformers.masking_utils import (
    create_causal_mask,
    create_recurrent_attention_mask,
    create_sliding_window_causal_mask,
)
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import capture_outputs

from t2r.layers import ConvertedAttention, build_mixer
from t2r.models.architectures import get_source
from t2r.models.configuration import (
    T2RGemma3TextConfig,
    T2RLlamaConfig,
    T2RMistralConfig,
    T2RPhi3Config,
    T2RQwen2Config,
    T2RQwen3Config,
)
from t2r.models.generation_cache import T2RCache
from t2r.models.loading import from_pretrained_verified

_MASK_FUNCTIONS = {
    "full_attention": create_causal_mask,
    "sliding_attention": create_sliding_window_causal_mask,
    "linear_attention": create_recurrent_attention_mask,
}


def init_new_parameters(module, config) -> None:
    """Give the new gates their deliberate start (see `t2r.layers`); runs after the generic init of children."""
    if hasattr(module, "init_parameters"):
        module.init_parameters(std=config.initializer_range)


def rotary_of_type(rotary_emb, per_layer_type: bool, layer_type: str | None, like: torch.Tensor,
                   position_ids: torch.Tensor):
    """(cos, sin) `[B, T, R]` of the layers of `layer_type` at `position_ids` `[B, T]`, in `like`'s dtype: one
    rotary embedding for every layer in most sources, one per type where the source's differs by type
    (`SourceAdapter.rotary_per_layer_type`)."""
    if per_layer_type:
        return rotary_emb(like, position_ids, layer_type)
    return rotary_emb(like, position_ids=position_ids)


def rotary_at(rotary_emb, per_layer_type: bool, layer_types: tuple, like: torch.Tensor, position_ids: torch.Tensor,
              layer_idx: int):
    """Layer `layer_idx`'s (cos, sin): what its keys were rotated with when they arrived (a window's ring
    rotates them again)."""
    return rotary_of_type(rotary_emb, per_layer_type, layer_types[layer_idx], like, position_ids)


class T2RModelMixin:
    """Swaps the attention modules named by `config.t2r_mixers` and runs the decoder with per-layer masks."""

    _is_stateful = True  # generate() then refuses assisted decoding, which would need state rollback
    _can_compile_fullgraph = False
    _supports_flash_attn = False  # recurrent layers take the 2D padding mask, not varlen flash kwargs

    def __init__(self, config):
        super().__init__(config)
        self.rotary_per_layer_type = get_source(config.model_type).rotary_per_layer_type
        for layer_idx, mixer in enumerate(config.t2r_mixers):
            if mixer != "softmax":
                layer = self.layers[layer_idx]
                options = config.mixer_options(layer_idx)
                layer.self_attn = build_mixer(mixer, layer.self_attn, config, layer_idx, options)
        self.post_init()

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """The source class's, refusing a damaged directory t2r wrote (`t2r.models.loading`)."""
        return from_pretrained_verified(super().from_pretrained, pretrained_model_name_or_path, args, kwargs)

    def _init_weights(self, module):
        super()._init_weights(module)
        init_new_parameters(module, self.config)

    def layer_masks(self, attention_mask, inputs_embeds, past_key_values, position_ids) -> dict:
        """The mask each kind of layer needs: causal (full or sliding) for softmax, 2D padding for the rest."""
        kwargs = dict(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                      past_key_values=past_key_values, position_ids=position_ids)
        kinds = set(self.config.layer_types) | {"linear_attention"}
        masks = {kind: _MASK_FUNCTIONS[kind](**kwargs) for kind in kinds}
        masks["padding"] = attention_mask if attention_mask is not None and attention_mask.ndim == 2 else None
        return masks

    def layer_mask(self, masks: dict, layer_idx: int):
        """Softmax layers: the source's causal mask; converted layers: the 2D padding mask they ask for."""
        attention = self.layers[layer_idx].self_attn
        if isinstance(attention, ConvertedAttention):
            return masks["padding"] if attention.needs_full_padding_mask else masks["linear_attention"]
        return masks[self.config.layer_types[layer_idx]]

    def position_embeddings_by_type(self, hidden_states, position_ids) -> dict:
        """(cos, sin) per layer type (`rotary_of_type`), computed once where every type shares one."""
        kinds = set(self.config.layer_types)
        if self.rotary_per_layer_type:
            return {kind: rotary_of_type(self.rotary_emb, True, kind, hidden_states, position_ids) for kind in kinds}
        return dict.fromkeys(kinds, rotary_of_type(self.rotary_emb, False, None, hidden_states, position_ids))

    @merge_with_config_defaults
    @capture_outputs
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, use_cache=None, **kwargs) -> BaseModelOutputWithPast:
        if (input_ids is None) ^ (inputs_embeds is not None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        if use_cache and past_key_values is None:
            past_key_values = T2RCache(self.config)
        if isinstance(past_key_values, T2RCache):  # the rotary module, not the model: a copied cache copies it
            past_key_values.rotary_at = partial(rotary_at, self.rotary_emb, self.rotary_per_layer_type,
                                                tuple(self.config.layer_types))
        if position_ids is None:
            past_seen = past_key_values.get_seq_length() if past_key_values is not None else 0
            position_ids = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device)[None] + past_seen

        masks = self.layer_masks(attention_mask, inputs_embeds, past_key_values, position_ids)
        hidden_states = inputs_embeds
        position_embeddings = self.position_embeddings_by_type(hidden_states, position_ids)
        for layer_idx, decoder_layer in enumerate(self.layers[: self.config.num_hidden_layers]):
            hidden_states = decoder_layer(
                hidden_states, attention_mask=self.layer_mask(masks, layer_idx),
                position_embeddings=position_embeddings[self.config.layer_types[layer_idx]],
                position_ids=position_ids, past_key_values=past_key_values, use_cache=use_cache, **kwargs,
            )
        hidden_states = self.norm(hidden_states)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, past_key_values=past_key_values)


class T2RCausalLMMixin:
    """Causal LM head over the converted base model; generate() gets its cache from the model's forward."""

    _is_stateful = True
    _can_compile_fullgraph = False
    _supports_flash_attn = False

    def __init__(self, config):
        """The source causal LM's `__init__` (the same in every source) with the converted base model
        (`SourceAdapter.model_class`) in place of the source's, which is never built: `super(source_class)`
        skips the source class's own body (`tests/models/test_sources.py` checks the result for every source)."""
        mro = type(self).__mro__
        source_class = mro[mro.index(T2RCausalLMMixin) + 1]  # e.g. LlamaForCausalLM
        super(source_class, self).__init__(config)
        self.model = get_source(config.model_type).model_class(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """The source class's, refusing a damaged directory t2r wrote (`t2r.models.loading`)."""
        return from_pretrained_verified(super().from_pretrained, pretrained_model_name_or_path, args, kwargs)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        """No stock DynamicCache: the model's forward builds a `T2RCache` on the first call."""
        return False

    def _init_weights(self, module):
        super()._init_weights(module)
        init_new_parameters(module, self.config)

    def converted_layers(self) -> dict[int, ConvertedAttention]:
        return {i: layer.self_attn for i, layer in enumerate(self.model.layers)
                if isinstance(layer.self_attn, ConvertedAttention)}


class T2RLlamaModel(T2RModelMixin, LlamaModel):
    config: T2RLlamaConfig


class T2RLlamaForCausalLM(T2RCausalLMMixin, LlamaForCausalLM):
    config: T2RLlamaConfig


class T2RMistralModel(T2RModelMixin, MistralModel):
    config: T2RMistralConfig


class T2RMistralForCausalLM(T2RCausalLMMixin, MistralForCausalLM):
    config: T2RMistralConfig


class T2RQwen2Model(T2RModelMixin, Qwen2Model):
    config: T2RQwen2Config


class T2RQwen2ForCausalLM(T2RCausalLMMixin, Qwen2ForCausalLM):
    config: T2RQwen2Config


class T2RQwen3Model(T2RModelMixin, Qwen3Model):
    config: T2RQwen3Config


class T2RQwen3ForCausalLM(T2RCausalLMMixin, Qwen3ForCausalLM):
    config: T2RQwen3Config


class T2RPhi3Model(T2RModelMixin, Phi3Model):
    config: T2RPhi3Config


class T2RPhi3ForCausalLM(T2RCausalLMMixin, Phi3ForCausalLM):
    config: T2RPhi3Config


class T2RGemma3TextModel(T2RModelMixin, Gemma3TextModel):
    config: T2RGemma3TextConfig


class T2RGemma3ForCausalLM(T2RCausalLMMixin, Gemma3ForCausalLM):
    config: T2RGemma3TextConfig
