"""Gated linear attention (Yang et al. 2024, eq. 3): S_t = Diag(alpha_t) S_{t-1} + k_t v_t^T.

The forget gate alpha_t = sigmoid(W2 W1 x_t + b)^(1/tau) is low rank (GLA sec. 4.4). W2 starts at zero
and b at RetNet's per-head decays, so the converted layer starts as retention and learns data dependence.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init

from t2r.layers.base import RecurrentMixer, decay_for_lookback, with_denominator
from t2r.ops.gla import gla


class LowRankForgetGate(nn.Module):
    """x `[B,T,hidden]` -> log alpha `[B,T,H,K]` (<= 0)."""

    def __init__(self, hidden_size: int, num_heads: int, head_dim: int, rank: int, normalizer: float):
        super().__init__()
        self.num_heads, self.head_dim, self.normalizer = num_heads, head_dim, normalizer
        # Own parameters (not nn.Linear children) so the deliberate init below is what loading runs.
        self.down = nn.Parameter(torch.empty(rank, hidden_size))
        self.up = nn.Parameter(torch.empty(num_heads * head_dim, rank))
        self.bias = nn.Parameter(torch.empty(num_heads * head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(F.linear(x, self.down), self.up, self.bias).float()
        return (F.logsigmoid(logits) / self.normalizer).view(*x.shape[:-1], self.num_heads, self.head_dim)

    def init_parameters(self, std: float) -> None:
        """Start as retention: alpha_h = gamma_h = 1 - 2^(-5-h), i.e. b = logit(gamma_h^tau)."""
        init.normal_(self.down, std=std)
        init.zeros_(self.up)
        bias = []
        for h in range(self.num_heads):
            target = (1 - 2 ** (-5 - h)) ** self.normalizer  # sigmoid(b) = gamma^tau
            bias += [math.log(target / (1 - target))] * self.head_dim
        init.copy_(self.bias, torch.tensor(bias))


class GatedLinearAttention(RecurrentMixer):
    """`init_from_lookback`: the gate's bias b_h = logit(gamma_h^tau) per kv head, gamma_h from the look-back of
    its query heads (`t2r.layers.base.decay_for_lookback`), instead of RetNet's fixed schedule."""

    target = "gla"

    def __init__(self, attention, config, layer_idx, options):
        super().__init__(attention, config, layer_idx, options)
        self.gate = LowRankForgetGate(
            self.hidden_size, self.num_kv_heads, self.head_dim, options.gate_low_rank_dim,
            options.gate_logit_normalizer,
        )

    @torch.no_grad()
    def init_from_lookback(self, lookback: torch.Tensor) -> None:
        target = decay_for_lookback(self.group_lookback(lookback)) ** self.gate.normalizer
        bias = torch.log(target / (1 - target)).repeat_interleave(self.head_dim)
        self.gate.bias.copy_(bias.to(self.gate.bias))

    def entry(self, hidden_states):
        """log alpha `[B, T, H, K]` of the tokens entering the state."""
        return self.gate(hidden_states)

    @classmethod
    def entry_bytes(cls, options, heads, kv_heads, head_dim, element_size) -> int:
        return kv_heads * head_dim * 4  # fp32

    def recur(self, entry, q, k, v, state, output_final_state, cu_seqlens):
        g = entry

        def run(v):
            return gla(q, k, v, g, scale=self.scaling, initial_state=state, output_final_state=output_final_state,
                       cu_seqlens=cu_seqlens)
        return with_denominator(run, v) if self.options.denominator else run(v)
