"""Window + sinks inside a converted layer: exact softmax over recent tokens, the recurrent state for the rest.

With `window=W, sinks=S` (LoLCATs' sliding window, Zhang et al. 2025; StreamingLLM's sinks, Xiao et al. 2024),
a fixed-state layer computes

    o_t = SWA_t + lambda_h * state_t

- SWA_t: the source's own softmax attention (its q/k norms, RoPE and scale) over the document's first S tokens
  and its last W tokens (`t2r.ops.window`);
- state_t: the mixer's recurrent read-out (feature map, gates, output norm as configured), where a token enters
  the state only when it leaves the window (at step t the state takes token t - W, with that token's own gate;
  the first S tokens never enter). The state thus holds only what the softmax cannot see;
- lambda_h: one learned gain per query head, starting at 0.

Why a sum with a zero-started gain rather than a shared normaliser (LoLCATs) or a joint softmax with GSA's slots:
GLA and retention have no normaliser to share (unnormalised, with an output norm), and GSA's slot logits are on
another scale than q.k; a sum works for every mixer the same way. With lambda = 0 a freshly converted layer is
the source's attention restricted to window + sinks (SmolLM2, training-free: 1.10x perplexity at positions
1-2K for W=256, S=4), and for sequences no longer than W + S it is exactly the source's attention whatever
lambda is, since nothing has left the window and the state reads zero. Training moves lambda off zero first
(its gradient is the state's read-out), then the gates learn through it, as LoRA's zero-started B does.

Generation keeps the state plus a ring of the last W tokens and the S sinks (`WindowedStateLayer`): memory per
sequence stays constant.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import initialization as init

from t2r.ops.window import masked_window_attention, window_attention


class WindowGain(nn.Module):
    """lambda `[HQ]`: how much of the recurrent state's read-out joins the window's softmax, per query head."""

    def __init__(self, num_heads: int):
        super().__init__()
        self.gain = nn.Parameter(torch.zeros(num_heads))

    def forward(self, state_output: torch.Tensor) -> torch.Tensor:
        return state_output * self.gain.to(state_output.dtype)[:, None]

    def init_parameters(self, std: float) -> None:
        init.zeros_(self.gain)


def _cached_keys(layer, ring_k_rot: torch.Tensor, new: dict, sinks: int) -> dict:
    """Keys the new queries may read when the cache holds earlier tokens: sink slots, then the window's
    tokens past the sinks (the sinks among them are read from their slots; `ring_k_rot`: the ring's keys
    rotated again), then the new tokens."""
    parts = []
    if layer.sink_slots is not None:
        slots = layer.sink_slots
        parts.append(dict(k_rot=slots["k_rot"], v=slots["v"], pos=slots["pos"], abs=slots["abs"], real=slots["filled"]))
    recent = layer.recent
    parts.append(dict(k_rot=ring_k_rot, v=recent["v"], pos=recent["pos"], abs=recent["abs"],
                      real=recent["real"] & (recent["pos"] >= sinks)))
    parts.append({name: new[name] for name in ("k_rot", "v", "pos", "abs", "real")})
    return {name: torch.cat([part[name].to(parts[-1][name].dtype) for part in parts], 1) for name in parts[-1]}


def _ring_keys(mixer, layer, past_key_values, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rotated keys for the window's softmax, mapped keys for the state) of the ring's tokens, from the one
    unrotated copy it keeps: RoPE at their positions, as when they arrived, so the same values come out."""
    if past_key_values.rotary_at is None:
        raise ValueError("a window's cache rotates its keys with the model's rotary embedding: run the layers "
                         "through the converted model's forward (it hands the cache `rotary_at`)")
    recent = layer.recent
    rope = past_key_values.rotary_at(like, recent["pos"], mixer.layer_idx)
    (k_rot,) = mixer.rotate(recent["k_src"], position_embeddings=rope, dtype=recent["v"].dtype)
    (k,) = mixer.map_qk(recent["k_src"], position_embeddings=rope)
    return k_rot, k


def windowed_mix(mixer, hidden_states, q_rot, k_rot, q, k, k_source, v, attention_mask, past_key_values,
                 position_ids, cu_seqlens) -> torch.Tensor:
    """`mixer` (a `RecurrentMixer` with options.window > 0): SWA over (q_rot, k_rot, v) plus its gained state
    read-out over (q, k, v) with tokens entering the state W steps late (`k_source`: k before the feature map
    and RoPE, the one copy of a key a cache's ring keeps). Returns `[B, T, HQ, V]`."""
    window, sinks = mixer.options.window, mixer.options.sinks
    batch, length = q.shape[:2]
    device = q.device
    layer = past_key_values.layers[mixer.layer_idx] if past_key_values is not None else None
    seen = layer.seen_tokens if layer is not None else 0
    steps = torch.arange(length, device=device)
    real = (attention_mask[:, -length:].bool() if attention_mask is not None
            else torch.ones(batch, length, dtype=torch.bool, device=device))
    positions = (position_ids if position_ids is not None else steps + seen).expand(batch, length)
    new = dict(k=k, k_src=k_source, v=v, k_rot=k_rot, pos=positions.long(), real=real,
               abs=(steps + seen).expand(batch, length))
    entry = mixer.entry(hidden_states)  # what the state reads of a token when it enters (its gates), kept till then
    if entry is not None:
        new["entry"] = entry

    if layer is None or layer.recent is None:
        # the caller's own position tensor (shared by every layer: FlexAttention builds its mask once per forward)
        soft = window_attention(q_rot, k_rot, v, positions=position_ids if position_ids is not None else new["pos"],
                                real=real if attention_mask is not None else None, window=window, sinks=sinks,
                                scale=mixer.scaling)
        stream, offset = new, 0
    else:
        ring_k_rot, ring_k = _ring_keys(mixer, layer, past_key_values, hidden_states)
        keys = _cached_keys(layer, ring_k_rot, new, sinks)
        soft = masked_window_attention(q_rot, keys["k_rot"], keys["v"], q_abs=new["abs"], q_pos=new["pos"],
                                       k_abs=keys["abs"], k_pos=keys["pos"], k_real=keys["real"], window=window,
                                       sinks=sinks, scale=mixer.scaling)
        stream = {name: torch.cat([layer.recent[name], new[name]], 1) for name in ("entry", "v") if name in new}
        stream["k"] = torch.cat([ring_k.to(k.dtype), k], 1)
        offset = layer.recent["v"].shape[1]

    # token t - W enters the state at step t: a real token past the sinks, of the same document (pos >= W + S)
    source = (steps + offset - window).clamp(min=0)
    enters = (real & (new["pos"] >= window + sinks))[..., None, None]
    entry_in = stream["entry"][:, source] if "entry" in stream else None
    k_in, v_in = stream["k"][:, source] * enters.to(k.dtype), stream["v"][:, source] * enters.to(v.dtype)
    state = layer.get_state() if layer is not None else None
    q_in = q * real[..., None, None].to(q.dtype)  # a padded query reads nothing (nor reaches others by a convolution)
    read, new_state = mixer.recur(entry_in, q_in, k_in, v_in, state, output_final_state=layer is not None,
                                  cu_seqlens=cu_seqlens)
    if layer is not None:
        layer.set_state(new_state, length)
        layer.remember(new)
    return soft + mixer.window.forward(mixer.read_out(read)).to(soft.dtype)
