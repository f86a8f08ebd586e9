"""Gated DeltaNet (Yang, Kautz & Hatamizadeh 2024, eq. 10): a linear-attention state edited by the delta rule.

    S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,     o_t = scale S_t^T q_t

(`t2r.ops.gated_delta`). A write replaces what the state held under k_t instead of adding to it, so a fixed
state does not saturate (what lets delta-rule students keep retrieval after linearization; Haller et al.
2025). The layer reuses the source's q/k/v/o and adds, per kv head h:

- q and k L2-normalised per head: with ||k_t|| = 1 the transition I - beta_t k_t k_t^T has eigenvalues 1 and
  1 - beta_t, a contraction for beta_t in (0, 2), so the state stays bounded however long the input;
- beta_t = sigmoid(w_beta . x_t + b_beta) in (0, 1), w_beta = 0 and b_beta = 0 at the start: every token writes
  half of its value (a replacement halfway between adding, beta -> 0, and overwriting, beta = 1), the same for
  every token, so conversion adds no random per-token noise; w_beta still gets gradient (sigmoid' = 1/4);
- alpha_t = exp(g_t), g_t = -exp(A_log) softplus(w_a . x_t + dt_bias) (Mamba-2's form): w_a = 0, A_log = 0 and
  dt_bias = softplus^-1(-log gamma_h) so that alpha starts at RetNet's gamma_h = 1 - 2^(-5-h) (or at the
  source's look-back with init=teacher);
- optionally a causal depthwise convolution of kernel 4 over q, k, v (after the feature map), starting as
  the identity, whose last inputs join the generation cache; and a low-rank output gate starting at 1.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init

from t2r.layers.base import RecurrentMixer, decay_for_lookback
from t2r.layers.retnet import retention_log_decays
from t2r.layers.short_conv import ShortConvolution
from t2r.ops.gated_delta import gated_delta_rule

OUTPUT_GATE_RANK = 16


def inverse_softplus(y: torch.Tensor) -> torch.Tensor:
    """x with softplus(x) = y (y > 0), accurate for tiny y (x = log(expm1(y)))."""
    y = y.double()
    return torch.where(y > 20, y, torch.log(torch.expm1(y)))


class DeltaRuleGates(nn.Module):
    """x `[B,T,hidden]` -> (g `[B,T,H]` log decay <= 0, beta `[B,T,H]` in (0, 1)), both fp32 (fp64 for fp64 x)."""

    def __init__(self, hidden_size: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        # Own parameters (not nn.Linear children) so the deliberate init below is what loading runs.
        self.weight = nn.Parameter(torch.empty(2 * num_heads, hidden_size))  # rows: w_a per head, then w_beta
        self.beta_bias = nn.Parameter(torch.empty(num_heads))
        self.dt_bias = nn.Parameter(torch.empty(num_heads))
        self.A_log = nn.Parameter(torch.empty(num_heads))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = torch.promote_types(x.dtype, torch.float32)
        decay_logits, beta_logits = F.linear(x, self.weight).to(dtype).split(self.num_heads, -1)
        g = -self.A_log.to(dtype).exp() * F.softplus(decay_logits + self.dt_bias.to(dtype))
        return g, torch.sigmoid(beta_logits + self.beta_bias.to(dtype))

    def dt_bias_for(self, log_decay: torch.Tensor) -> torch.Tensor:
        """The dt_bias that makes g = log_decay while w_a . x = 0, at the current A_log."""
        return inverse_softplus(-log_decay.double() / self.A_log.detach().double().exp().cpu())

    def init_parameters(self, std: float) -> None:
        """Start data-independent: beta = 1/2 and alpha_h = RetNet's gamma_h = 1 - 2^(-5-h)."""
        init.zeros_(self.weight)
        init.zeros_(self.beta_bias)
        init.zeros_(self.A_log)
        init.copy_(self.dt_bias, inverse_softplus(-retention_log_decays(self.num_heads).double()).float())


class LowRankOutputGate(nn.Module):
    """x `[B,T,hidden]` -> 2 sigmoid(W_up W_down x) `[B,T,HQ,V]`, exactly 1 at the start (W_up = 0)."""

    def __init__(self, hidden_size: int, num_heads: int, head_dim: int, rank: int = OUTPUT_GATE_RANK):
        super().__init__()
        self.num_heads = num_heads
        self.down = nn.Parameter(torch.empty(rank, hidden_size))
        self.up = nn.Parameter(torch.empty(num_heads * head_dim, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(F.linear(x, self.down), self.up)
        return (2 * torch.sigmoid(logits)).view(*x.shape[:-1], self.num_heads, -1)

    def init_parameters(self, std: float) -> None:
        init.normal_(self.down, std=std)
        init.zeros_(self.up)


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    """Unit length per head (at least fp32 math, x's dtype out); a zero vector (a padded token's key) stays zero."""
    return F.normalize(x.to(torch.promote_types(x.dtype, torch.float32)), dim=-1, eps=1e-6).to(x.dtype)


class GatedDeltaAttention(RecurrentMixer):
    """`init_from_lookback`: dt_bias per kv head so that alpha_h starts at the decay whose mean look-back is that
    of its query heads (`t2r.layers.base.decay_for_lookback`), instead of RetNet's schedule.

    The state is one fp32 `[H, K, V]` per kv head, plus with a convolution the last conv_size - 1 inputs of q,
    k and v (`[conv_size - 1, (HQ + 2H) * D]`), both fixed in size."""

    target = "gdn"
    read_scale: float = 1.0
    """The op's scale on q: 1, not the source's 1/sqrt(d). With unit q and k, q.k is a cosine, and S^T q returns a
    stored value at its full size when q finds its key, as softmax attention returns an average of values; the
    source's scale belonged to the logits of its softmax (KL at conversion, SmolLM2: lower at 1 than at 1/8 or 2)."""

    def __init__(self, attention, config, layer_idx, options):
        super().__init__(attention, config, layer_idx, options)
        self.gates = DeltaRuleGates(self.hidden_size, self.num_kv_heads)
        if options.conv_size:
            channels = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
            self.conv = ShortConvolution(channels, options.conv_size)
        if options.output_gate:
            self.output_gate = LowRankOutputGate(self.hidden_size, self.num_heads, self.head_dim)

    @classmethod
    def number_of_states(cls, options) -> int:
        return 2 if options.conv_size else 1

    @classmethod
    def recurrent_state_bytes(cls, options, heads, kv_heads, head_dim) -> int:
        conv = max(options.conv_size - 1, 0) * (heads + 2 * kv_heads) * head_dim
        return (kv_heads * head_dim * head_dim + conv) * 4

    @torch.no_grad()
    def init_from_lookback(self, lookback: torch.Tensor) -> None:
        log_decay = decay_for_lookback(self.group_lookback(lookback)).log()
        self.gates.dt_bias.copy_(self.gates.dt_bias_for(log_decay).to(self.gates.dt_bias))

    def mix(self, hidden_states, q, k, v, attention_mask, past_key_values, cu_seqlens):
        if attention_mask is not None:  # a padded query must not reach real ones through the convolution
            q = q * attention_mask[:, -q.shape[1]:, None, None].to(q.dtype)
        return super().mix(hidden_states, q, k, v, attention_mask, past_key_values, cu_seqlens)

    def convolve(self, q, k, v, conv_state, cu_seqlens):
        """The short convolution over q, k, v of this call (their channels side by side)."""
        widths = [q.shape[2] * q.shape[3], k.shape[2] * k.shape[3], v.shape[2] * v.shape[3]]
        joined = torch.cat([t.flatten(2) for t in (q, k, v)], -1)
        mixed, conv_state = self.conv(joined, conv_state, cu_seqlens)
        q, k, v = (t.view(*t.shape[:2], -1, self.head_dim) for t in mixed.split(widths, -1))
        return q, k, v, conv_state.to(torch.promote_types(conv_state.dtype, torch.float32))

    def entry(self, hidden_states):
        """The gates of the tokens entering the state, `[B, T, H, 2]`: log decay g and write strength beta."""
        return torch.stack(self.gates(hidden_states), -1)

    @classmethod
    def entry_bytes(cls, options, heads, kv_heads, head_dim, element_size) -> int:
        return 2 * kv_heads * 4  # fp32

    def recur(self, entry, q, k, v, state, output_final_state, cu_seqlens):
        """Convolution (if any), L2 norms, then the gated delta rule with the gates of `entry` (the tokens
        entering the state: W steps late with a window). The state: S, or (S, the convolution's last inputs)."""
        recurrent, conv_state = (state if isinstance(state, tuple) else (state, None))
        if self.options.conv_size:
            q, k, v, conv_state = self.convolve(q, k, v, conv_state, cu_seqlens)
        g, beta = entry[..., 0].contiguous(), entry[..., 1].contiguous()
        o, recurrent = gated_delta_rule(l2_normalize(q).to(v.dtype), l2_normalize(k).to(v.dtype), v, g, beta,
                                        scale=self.read_scale, initial_state=recurrent,
                                        output_final_state=output_final_state, cu_seqlens=cu_seqlens)
        if not output_final_state:
            return o, None
        return o, ((recurrent, conv_state) if self.options.conv_size else recurrent)

    def gate_output(self, o: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        return o * self.output_gate(hidden_states).to(o.dtype) if self.options.output_gate else o
