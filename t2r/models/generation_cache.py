"""The generation cache of converted models: fixed-size states for recurrent layers, K/V for the rest.

transformers' own `DynamicCache` fails for an all-recurrent model (`get_seq_length` raises when no layer
holds K/V) and only marks a recurrent state as present when a conv state is written; this cache keeps its
own token count and flags, and exposes the two calls the mixers use: `get_state` / `set_state` and, for
FoX layers, `update_with_gates`.
"""

from __future__ import annotations

from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer, DynamicSlidingWindowLayer

from t2r.layers import get_mixer


def generation_memory(config, element_size: int = 2) -> tuple[int, int]:
    """(fixed bytes, bytes per token) that `T2RCache` holds for one sequence of a model with `config`
    (of a converted model, or of a source model, whose layers are all softmax).

    Each mixer states its own (`ConvertedAttention.state_bytes`); softmax layers hold K/V of `element_size`
    bytes per token. Sliding-window layers are counted as full K/V (an upper bound past the window).
    An unknown mixer is an error (`get_mixer`), never counted as something it is not.
    """
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    mixers = getattr(config, "t2r_mixers", None) or ["softmax"] * config.num_hidden_layers  # a source model
    fixed = per_token = 0
    for layer_idx, mixer in enumerate(mixers):
        if mixer == "softmax":
            per_token += 2 * kv_heads * head_dim * element_size
            continue
        spec = get_mixer(mixer)
        options = config.mixer_options(layer_idx)
        layer_fixed, layer_per_token = spec.layer_class.state_bytes(options, heads, kv_heads, head_dim, element_size)
        fixed, per_token = fixed + layer_fixed, per_token + layer_per_token
    return fixed, per_token


class T2RCache(Cache):
    """One cache layer per decoder layer, chosen by the layer's mixer (see `T2RConfigMixin.t2r_mixers`)."""

    is_compileable = False
    """Not compiled on purpose yet: a non-DynamicCache that claims compilability makes `generate` auto-compile."""

    def __init__(self, config, **kwargs):
        layers = []
        for layer_idx, (mixer, layer_type) in enumerate(zip(config.t2r_mixers, config.layer_types)):
            if mixer != "softmax":
                layers.append(get_mixer(mixer).layer_class.cache_layer(config.mixer_options(layer_idx)))
            elif layer_type == "sliding_attention" and getattr(config, "sliding_window", None):
                layers.append(DynamicSlidingWindowLayer(sliding_window=config.sliding_window))
            else:
                layers.append(DynamicLayer())
        super().__init__(layers=layers)
        self.rotary_at = None
        """`rotary_at(like, position_ids, layer_idx) -> (cos, sin)`: set by the model at each forward, for the
        window rings that keep their keys unrotated (`t2r.layers.window`)."""

    def get_state(self, layer_idx: int):
        return self.layers[layer_idx].get_state()

    def set_state(self, layer_idx: int, state, num_new_tokens: int) -> None:
        self.layers[layer_idx].set_state(state, num_new_tokens)

    def update_with_gates(self, k, v, g, layer_idx: int):
        return self.layers[layer_idx].update_with_gates(k, v, g)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens seen so far; answered by recurrent layers too, so an all-recurrent cache works in `generate`."""
        return self.layers[layer_idx].get_seq_length() if layer_idx < len(self.layers) else 0

    def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
        layer = self.layers[layer_idx] if layer_idx < len(self.layers) else None
        if isinstance(layer, CacheLayerMixin):
            return layer.get_mask_sizes(query_length)
        return self.get_seq_length(layer_idx) + query_length, 0
