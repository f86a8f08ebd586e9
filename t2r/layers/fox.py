"""Forgetting attention (Lin et al. 2025, FoX): softmax attention whose logits get sum_{l=j+1..i} log f_l.

f_t = sigmoid(w_f^T x_t + b_f) per query head (the paper's scalar forget gate). With b_f large the bias is
near zero, so a converted FoX model starts almost exactly as the source model. FoX is not constant-memory:
generation keeps K/V plus the log forget gates in the cache.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init

from t2r.layers.base import ConvertedAttention, decay_for_lookback
from t2r.layers.state import GatedKVLayer
from t2r.ops.fox import forgetting_attention


class ForgetGate(nn.Module):
    """x `[B,T,hidden]` -> log f `[B,T,HQ]` (<= 0)."""

    def __init__(self, hidden_size: int, num_heads: int, bias: float):
        super().__init__()
        self.initial_bias = bias
        # Own parameters (not an nn.Linear child) so the deliberate init below is what loading runs.
        self.weight = nn.Parameter(torch.empty(num_heads, hidden_size))
        self.bias = nn.Parameter(torch.empty(num_heads))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.logsigmoid(F.linear(x, self.weight, self.bias).float())

    def init_parameters(self, std: float) -> None:
        init.zeros_(self.weight)
        init.constant_(self.bias, self.initial_bias)


class ForgettingAttention(ConvertedAttention):
    target = "fox"
    needs_full_padding_mask = True

    def __init__(self, attention, config, layer_idx, options):
        super().__init__(attention, config, layer_idx, options)
        self.forget_gate = ForgetGate(self.hidden_size, self.num_heads, options.fox_gate_bias)

    @torch.no_grad()
    def init_from_lookback(self, lookback: torch.Tensor) -> None:
        """Forget gate bias b_h = logit(gamma_h) per query head from its look-back (the default, 8, keeps the
        source's attention; this makes each head forget at the pace its source attention looks back)."""
        gamma = decay_for_lookback(lookback)
        self.forget_gate.bias.copy_(torch.log(gamma / (1 - gamma)).to(self.forget_gate.bias))

    def mix(self, hidden_states, q, k, v, attention_mask, past_key_values, cu_seqlens):
        g = self.forget_gate(hidden_states)
        if past_key_values is not None:
            k, v, g = past_key_values.update_with_gates(k, v, g, self.layer_idx)
        if attention_mask is not None and bool(attention_mask.all()):
            attention_mask = None
        return forgetting_attention(q, k, v, g, scale=self.scaling, attention_mask=attention_mask,
                                    cu_seqlens=cu_seqlens)

    @classmethod
    def cache_layer(cls, options):
        return GatedKVLayer()

    @classmethod
    def state_bytes(cls, options, heads, kv_heads, head_dim, element_size):
        """K/V per token plus one fp32 log forget gate per query head."""
        return 0, 2 * kv_heads * head_dim * element_size + heads * 4
