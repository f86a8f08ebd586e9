"""The shared body of a converted attention layer: reuse q/k/v/o, run a recurrent mixer, keep its state.

A converted layer sits where the softmax attention was (`decoder_layer.self_attn`) and keeps the
projection modules under their original names (`q_proj`, `k_proj`, `v_proj`, `o_proj`), so the source
checkpoint loads unchanged and only the small gate parameters are new.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from t2r.layers.feature_maps import FEATURE_MAP_FUNCTIONS
from t2r.layers.options import MixerOptions
from t2r.layers.registry import teacher_init_refusal
from t2r.layers.state import RecurrentStateLayer, WindowedStateLayer

ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj")
"""The source attention's projections, under the sources' names (`qkv_proj`: Phi-3's fused q | k | v): reused by a
converted layer, and the default LoRA targets."""
REUSED_MODULES = (*ATTENTION_PROJECTIONS, "q_norm", "k_norm")
"""Submodules a converted layer takes from the source attention, under their source names: pretrained, never
new gates (the projections; `q_norm` / `k_norm`: Qwen3's and Gemma 3's per-head norms)."""


def decay_for_lookback(lookback: torch.Tensor, max_lookback: float = 4096.0) -> torch.Tensor:
    """Per-step decay gamma whose exponential weights (1 - gamma) gamma^k have mean look-back `lookback`
    tokens: gamma = d / (1 + d), d clamped to [1, max_lookback] (`t2r.convert.lookback` measures d)."""
    d = lookback.double().clamp(1.0, max_lookback)
    return d / (1 + d)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of a `[B, T, H, D]` tensor; `cos`, `sin` are `[B, T, R]` as the source model makes them.
    R < D (partial RoPE, e.g. Phi-3's `partial_rotary_factor`): the first R channels rotate, the rest pass."""
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    rotary = cos.shape[-1]
    if rotary == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    x_rot, x_pass = x.split([rotary, x.shape[-1] - rotary], -1)
    return torch.cat([x_rot * cos + rotate_half(x_rot) * sin, x_pass], -1)


def with_denominator(run, v: torch.Tensor, eps: float = 1e-6):
    """Normalised linear attention (Katharopoulos et al. 2020, eq. 5): o_t = sum_s w_ts v_s / sum_s w_ts, with
    w_ts = phi(q_t).(decayed) phi(k_s) the mixer's own weights. `run(v)` is the mixer's op on values `v`
    `[B,T,H,V]` -> (o, state); it runs once on v with a column of ones appended, whose read-out is the
    denominator, so the state `[.., K, V + 1]` carries it through chunks, packed sequences and decoding."""
    o, state = run(torch.cat([v, torch.ones_like(v[..., :1])], -1))
    return o[..., :-1] / o[..., -1:].clamp_min(eps), state


def head_rms_norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMS normalisation over the head dimension, without weight (adds no parameter)."""
    return F.rms_norm(x, (x.shape[-1],), eps=eps)


class ConvertedAttention(nn.Module):
    """Base of every converted mixer: projections, feature map, RoPE and output, shared by all targets.

    The contract a mixer implements (`t2r.layers.registry` names the class):
    - `mix(hidden_states, q, k, v, attention_mask, past_key_values, cu_seqlens)` -> per-head output
      `[B, T, HQ, V]`, reading and writing its own state in the cache;
    - `cache_layer(options)` -> the `T2RCache` layer holding that state (`t2r.layers.state`);
    - `state_bytes(options, heads, kv_heads, head_dim, element_size)` -> (fixed bytes, bytes per token)
      of that state for one sequence.
    `RecurrentMixer` implements all three for a fixed-size recurrent state.
    """

    target: str = ""
    needs_full_padding_mask: bool = False
    """The 2D padding mask over every cached token (FoX's softmax reads them), rather than over this call's
    tokens only, and none during single-token decode (a recurrent state has no padding to skip)."""

    def __init__(self, attention: nn.Module, config, layer_idx: int, options: MixerOptions):
        super().__init__()
        self.layer_idx = layer_idx
        self.options = options
        self.head_dim = attention.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.hidden_size = config.hidden_size
        # the source's softmax scale on q.k (Gemma 3: query_pre_attn_scalar ** -0.5), kept by every mixer
        self.scaling = getattr(attention, "scaling", self.head_dim ** -0.5)
        self.fused_qkv = hasattr(attention, "qkv_proj")
        if self.fused_qkv:  # q | k | v along the output features
            self.qkv_proj = attention.qkv_proj
        else:
            self.q_proj, self.k_proj, self.v_proj = attention.q_proj, attention.k_proj, attention.v_proj
        self.o_proj = attention.o_proj
        # per-head q/k RMSNorm of the source attention (Qwen3), reused: applied before the feature map and RoPE
        self.q_norm, self.k_norm = getattr(attention, "q_norm", None), getattr(attention, "k_norm", None)
        self.feature_map = FEATURE_MAP_FUNCTIONS[options.feature_map]

    def project(self, hidden_states):
        """q `[B,T,HQ,D]`, k and v `[B,T,H,D]` as the source attention makes them, before RoPE."""
        batch, length, _ = hidden_states.shape
        if self.fused_qkv:
            kv_width = self.num_kv_heads * self.head_dim
            q, k, v = self.qkv_proj(hidden_states).split([self.num_heads * self.head_dim, kv_width, kv_width], -1)
        else:
            q, k, v = self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)
        q = q.view(batch, length, self.num_heads, self.head_dim)
        k = k.view(batch, length, self.num_kv_heads, self.head_dim)
        v = v.view(batch, length, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v

    @staticmethod
    def rotate(*tensors, position_embeddings, dtype) -> tuple[torch.Tensor, ...]:
        """RoPE on each of `tensors` (q and k, or a cache's keys alone), in `dtype`."""
        if position_embeddings is None:
            raise ValueError("this layer applies RoPE (rope=True, or a window) and needs "
                             "position_embeddings=(cos, sin)")
        # fp32 cos/sin (the residual stream under autocast) promote q, k; keep the projections' dtype, as
        # autocast does for the source's SDPA, so the kernels get one dtype (FoX's refuse mixed ones)
        return tuple([apply_rope(x, *position_embeddings).to(dtype) for x in tensors])

    def map_qk(self, *tensors, position_embeddings) -> tuple[torch.Tensor, ...]:
        """The mixer's q, k (or keys alone): the feature map, then (optionally) RoPE."""
        mapped = tuple([self.feature_map(x) for x in tensors])
        if self.options.rope:
            mapped = self.rotate(*mapped, position_embeddings=position_embeddings, dtype=mapped[0].dtype)
        return mapped

    def read_out(self, o: torch.Tensor) -> torch.Tensor:
        """The mixer's per-head output as the output projection reads it (optional RMS norm)."""
        return head_rms_norm(o) if self.options.output_norm else o

    def forward(self, hidden_states, attention_mask=None, position_embeddings=None, past_key_values=None, **kwargs):
        q_source, k_source, v = self.project(hidden_states)
        q, k = self.map_qk(q_source, k_source, position_embeddings=position_embeddings)
        if getattr(self.options, "window", 0):
            from t2r.layers.window import windowed_mix

            q_rot, k_rot = self.rotate(q_source, k_source, position_embeddings=position_embeddings, dtype=v.dtype)
            o = windowed_mix(self, hidden_states, q_rot, k_rot, q, k, k_source, v, attention_mask, past_key_values,
                             kwargs.get("position_ids"), kwargs.get("cu_seq_lens_q"))
        else:
            o = self.read_out(self.mix(hidden_states, q, k, v, attention_mask=attention_mask,
                                       past_key_values=past_key_values, cu_seqlens=kwargs.get("cu_seq_lens_q")))
        o = self.gate_output(o, hidden_states).reshape(*hidden_states.shape[:-1], -1).to(hidden_states.dtype)
        return self.o_proj(o), None

    def gate_output(self, o: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        """The per-head output `[B, T, HQ, V]` as the output projection reads it, gated by the current tokens'
        hidden states (window included) in mixers with an output gate; the identity here."""
        return o

    def mix(self, hidden_states, q, k, v, attention_mask, past_key_values, cu_seqlens) -> torch.Tensor:
        raise NotImplementedError

    @classmethod
    def cache_layer(cls, options: MixerOptions):
        raise NotImplementedError

    @classmethod
    def state_bytes(cls, options: MixerOptions, heads: int, kv_heads: int, head_dim: int,
                    element_size: int) -> tuple[int, int]:
        raise NotImplementedError

    def init_from_lookback(self, lookback: torch.Tensor) -> None:
        """Set the forget gates' starting decay from the source's per-query-head look-back `lookback` `[HQ]`
        (`t2r.convert.lookback`); mixers without a learned decay refuse."""
        raise ValueError(teacher_init_refusal(self.target))

    def group_lookback(self, lookback: torch.Tensor) -> torch.Tensor:
        """`[HQ]` -> `[H]`: the mean look-back of the query heads that share each kv head."""
        return lookback.view(self.num_kv_heads, -1).mean(-1)

    def extra_repr(self) -> str:
        return f"target={self.target}, heads={self.num_heads}/{self.num_kv_heads}, head_dim={self.head_dim}"


class RecurrentMixer(ConvertedAttention):
    """A mixer with a fixed-size recurrent state: subclasses implement `recur`, the op over one call's tokens.

    `recur(entry, q, k, v, state, output_final_state, cu_seqlens)` returns the output `[B,T,HQ,V]` and the new
    state (a tensor, or a tuple of `num_states` tensors), kept in fp32 by the cache. `entry` is what `entry(x)`
    makes of the hidden states of the tokens entering the state (by default the hidden states themselves; the
    built-in mixers: their gates), so that a window's ring keeps that per token, not the hidden state.
    """

    num_states: int = 1

    def __init__(self, attention, config, layer_idx, options):
        super().__init__(attention, config, layer_idx, options)
        if getattr(options, "window", 0):
            from t2r.layers.window import WindowGain

            self.window = WindowGain(self.num_heads)

    def mix(self, hidden_states, q, k, v, attention_mask, past_key_values, cu_seqlens):
        if attention_mask is not None:
            # 2D padding mask: a padded token writes nothing (k = v = 0). Exact for left padding,
            # where the state is still zero while the gates decay it.
            keep = attention_mask[:, -q.shape[1]:, None, None].to(k.dtype)
            k, v = k * keep, v * keep
        state = past_key_values.get_state(self.layer_idx) if past_key_values is not None else None
        o, new_state = self.recur(self.entry(hidden_states), q, k, v, state,
                                  output_final_state=past_key_values is not None, cu_seqlens=cu_seqlens)
        if past_key_values is not None:
            past_key_values.set_state(self.layer_idx, new_state, q.shape[1])
        return o

    def entry(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        """What `recur` reads of the hidden states `[B, T, hidden]` of the tokens it takes in, per token
        `[B, T, ...]` (or None: nothing). A per-token function: a window's ring keeps it for the tokens that
        have not entered the state yet (`t2r.layers.window`). Default: the hidden states themselves."""
        return hidden_states

    @classmethod
    def entry_bytes(cls, options, heads, kv_heads, head_dim, element_size) -> int:
        """Bytes of one token's `entry`: the hidden state (`heads x head_dim` wide) unless a mixer says less."""
        return heads * head_dim * element_size

    def recur(self, entry, q, k, v, state, output_final_state, cu_seqlens):
        raise NotImplementedError

    @classmethod
    def number_of_states(cls, options: MixerOptions) -> int:
        """How many tensors `recur` returns as its state (a tuple when more than one)."""
        return cls.num_states

    @classmethod
    def cache_layer(cls, options: MixerOptions):
        if getattr(options, "window", 0):
            return WindowedStateLayer(cls.number_of_states(options), options.window, options.sinks)
        return RecurrentStateLayer(number_of_states=cls.number_of_states(options))

    @classmethod
    def state_bytes(cls, options, heads, kv_heads, head_dim, element_size):
        """The recurrent state, plus with a window its ring of W tokens (k, v and `entry`) and S sinks (rotated
        k, v); none grows with the context."""
        fixed = cls.recurrent_state_bytes(options, heads, kv_heads, head_dim)
        window, sinks = getattr(options, "window", 0), getattr(options, "sinks", 0)
        kv = kv_heads * head_dim * element_size
        entry = cls.entry_bytes(options, heads, kv_heads, head_dim, element_size)
        fixed += window * (2 * kv + entry + 17) + sinks * (2 * kv + 17)  # + pos, abs (int64), flag
        return fixed, 0

    @classmethod
    def recurrent_state_bytes(cls, options, heads, kv_heads, head_dim) -> int:
        """One fp32 `[H, K, V]` state per kv head (GLA, retention), `[H, K, V + 1]` with the denominator's column
        (`with_denominator`); GSA overrides it."""
        values = head_dim + bool(getattr(options, "denominator", False))
        return cls.num_states * kv_heads * head_dim * values * 4
