"""What a converted layer keeps between generation steps: the cache layers of `T2RCache`.

A mixer picks its cache layer (`ConvertedAttention.cache_layer`): a fixed-size recurrent state for
constant-memory mixers, K/V plus log forget gates for FoX.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer, LinearAttentionLayer


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


class WindowedStateLayer(RecurrentStateLayer):
    """A recurrent state plus what a layer with `window` / `sinks` reads exactly (`t2r.layers.window`): the last
    `window` tokens (k before RoPE and the feature map, rotated again for the softmax and mapped when the token
    enters the recurrent state; v; `entry`, its gates) and each sequence's first `sinks` tokens (rotated k, v).
    Fixed size."""

    RING = ("k_src", "v", "entry", "pos", "abs", "real")
    """What the ring keeps of each of the last `window` tokens (`entry` where the mixer has one)."""

    def __init__(self, number_of_states: int, window: int, sinks: int):
        super().__init__(number_of_states=number_of_states)
        self.window, self.sinks = window, sinks
        self.recent: dict[str, torch.Tensor] | None = None
        """`[B, <= window, ...]` per field of `RING`."""
        self.sink_slots: dict[str, torch.Tensor] | None = None
        """`[B, sinks, ...]` per field: k_rot, v, pos, abs, and filled (False until that sink has arrived)."""

    def remember(self, new: dict[str, torch.Tensor]) -> None:
        """Add one call's tokens (fields `[B, T, ...]`): keep the last `window` (the fields of `RING`), fill the
        sink slots (rotated k, v)."""
        ring = {name: new[name] for name in self.RING if name in new}
        if self.recent is not None:
            ring = {name: torch.cat([self.recent[name], t], 1) for name, t in ring.items()}
        # copies: a slice would keep the whole call's tensors (a long prompt's) alive
        self.recent = {name: t[:, -self.window:].clone() for name, t in ring.items()}
        if not self.sinks:
            return
        if self.sink_slots is None:
            fields = ("k_rot", "v", "pos", "abs")
            self.sink_slots = {name: new[name].new_zeros(new[name].shape[0], self.sinks, *new[name].shape[2:])
                               for name in fields}
            self.sink_slots["filled"] = torch.zeros_like(self.sink_slots["pos"], dtype=torch.bool)
        rows, columns = (new["real"] & (new["pos"] < self.sinks)).nonzero(as_tuple=True)
        slots = new["pos"][rows, columns]
        for name, buffer in self.sink_slots.items():
            buffer[rows, slots] = True if name == "filled" else new[name][rows, columns].to(buffer.dtype)

    def reset(self) -> None:
        super().reset()
        self.recent = self.sink_slots = None

    def _map_states(self, fn) -> None:
        super()._map_states(fn)
        for buffers in (self.recent, self.sink_slots):
            if buffers is not None:
                buffers.update({name: fn(t) for name, t in buffers.items()})

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._map_states(lambda t: t.index_select(0, beam_idx.to(t.device)))
