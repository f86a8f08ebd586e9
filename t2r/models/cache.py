"""The generation cache of converted models: fixed-size states for recurrent layers, K/V for the rest.

transformers' own `DynamicCache` fails for an all-recurrent model (`get_seq_length` raises when no layer
holds K/V) and only marks a recurrent state as present when a conv state is written; this cache keeps its
own token count and flags, and exposes the two calls the mixers use: `get_state` / `set_state` and, for
FoX layers, `update_with_gates`.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer, DynamicSlidingWindowLayer, LinearAttentionLayer

from t2r.layers import MIXER_CLASSES, RECURRENT_MIXERS


class RecurrentStateLayer(LinearAttentionLayer):
    """One recurrent layer's state: `number_of_states` fp32 tensors of fixed size, whatever the length."""

    def __init__(self, number_of_states: int = 1):
        super().__init__(number_of_states=number_of_states)
        self.seen_tokens = 0

    def get_state(self):
        if not all(self.has_previous_state.values()):
            return None
        states = tuple(self.recurrent_states[i] for i in range(self.number_of_states))
        return states[0] if self.number_of_states == 1 else states

    def set_state(self, state, num_new_tokens: int) -> None:
        states = state if isinstance(state, tuple) else (state,)
        for i, s in enumerate(states):
            self.update_recurrent_state(s, state_idx=i)
            self.has_previous_state[i] = True
        self.seen_tokens += num_new_tokens

    def reset(self) -> None:
        super().reset()
        self.seen_tokens = 0

    def get_seq_length(self) -> int:
        return self.seen_tokens

    def _map_states(self, fn) -> None:
        for i in range(self.number_of_states):
            if self.is_recurrent_states_initialized[i]:
                self.recurrent_states[i] = fn(self.recurrent_states[i])

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map_states(lambda s: s.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._map_states(lambda s: s[indices, ...])

    @property
    def batch_size(self) -> int:
        return self.recurrent_states[0].shape[0] if self.is_recurrent_states_initialized[0] else -1


class GatedKVLayer(DynamicLayer):
    """K/V of a FoX layer plus its log forget gates `[B, HQ, T]`, grown together."""

    def lazy_initialization(self, key_states, value_states) -> None:
        super().lazy_initialization(key_states, value_states)
        self.gates = torch.tensor([], dtype=torch.float32, device=self.device)

    def update_with_gates(self, k, v, g):
        """k, v `[B,T,H,D]`, g `[B,T,HQ]` -> all cached k, v, g in the same layout."""
        keys, values = self.update(k.transpose(1, 2), v.transpose(1, 2))
        self.gates = torch.cat([self.gates, g.transpose(1, 2).float()], dim=-1)
        return keys.transpose(1, 2), values.transpose(1, 2), self.gates.transpose(1, 2)

    def reset(self) -> None:
        super().reset()
        if self.is_initialized:
            self.gates = self.gates[..., :0]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        super().reorder_cache(beam_idx)
        if self.is_initialized and self.gates.numel():
            self.gates = self.gates.index_select(0, beam_idx.to(self.gates.device))

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        if self.is_initialized and self.gates.numel():
            self.gates = self.gates.repeat_interleave(repeats, dim=0)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        if self.is_initialized and self.gates.numel():
            self.gates = self.gates[indices, ...]

    def crop(self, max_length: int) -> None:
        super().crop(max_length)
        if self.is_initialized:
            self.gates = self.gates[..., : self.keys.shape[-2]]


def generation_memory(config, element_size: int = 2) -> tuple[int, int]:
    """(fixed bytes, bytes per token) that `T2RCache` holds for one sequence of a model with `config`
    (of a converted model, or of a source model, whose layers are all softmax).

    Recurrent layers hold fp32 states of fixed size (GSA: K~ [H,K,M] and V~ [H,M,V]; GLA and RetNet:
    S [H,K,V]); softmax and FoX layers hold K/V of `element_size` bytes per token (FoX adds its fp32 gates).
    Sliding-window layers are counted as full K/V (an upper bound past the window).
    """
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    mixers = getattr(config, "t2r_mixers", None) or ["softmax"] * config.num_hidden_layers  # a source model
    fixed = per_token = 0
    for mixer in mixers:
        if mixer == "gsa":
            fixed += 2 * kv_heads * head_dim * config.t2r_options["gsa"]["num_slots"] * 4
        elif mixer in ("gla", "retnet"):
            fixed += kv_heads * head_dim * head_dim * 4
        elif mixer in ("softmax", "fox"):
            per_token += 2 * kv_heads * head_dim * element_size + (heads * 4 if mixer == "fox" else 0)
        else:  # never guess: a mixer this table does not know has a state of its own
            raise ValueError(f"generation_memory: unknown mixer {mixer!r}; known: gsa, gla, retnet, fox, softmax")
    return fixed, per_token


class T2RCache(Cache):
    """One cache layer per decoder layer, chosen by the layer's mixer (see `T2RConfigMixin.t2r_mixers`)."""

    is_compileable = False
    """Not compiled on purpose yet: a non-DynamicCache that claims compilability makes `generate` auto-compile."""

    def __init__(self, config, **kwargs):
        layers = []
        for mixer, layer_type in zip(config.t2r_mixers, config.layer_types):
            if mixer in RECURRENT_MIXERS:
                layers.append(RecurrentStateLayer(number_of_states=MIXER_CLASSES[mixer].num_states))
            elif mixer == "fox":
                layers.append(GatedKVLayer())
            elif layer_type == "sliding_attention" and getattr(config, "sliding_window", None):
                layers.append(DynamicSlidingWindowLayer(sliding_window=config.sliding_window))
            else:
                layers.append(DynamicLayer())
        super().__init__(layers=layers)

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
