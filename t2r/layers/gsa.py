"""Gated slot attention (Zhang et al. 2024): a bounded memory of M slots per kv head, read by softmax.

Eq. 8: alpha_t = sigmoid(W_alpha x_t)^(1/tau), slot writes s_t = 1 - alpha_t; eq. 6-7 run two passes of
gated linear attention joined by a softmax over the slots (`t2r.ops.gsa`). W_alpha is the only new
parameter: hidden -> kv_heads x num_slots.
"""

import torch.nn.functional as F
from torch import nn

from t2r.layers.base import RecurrentMixer
from t2r.ops.gsa import gsa


class GatedSlotAttention(RecurrentMixer):
    target = "gsa"
    num_states = 2

    def __init__(self, attention, config, layer_idx, options):
        super().__init__(attention, config, layer_idx, options)
        self.num_slots = options.num_slots
        self.gate_logit_normalizer = options.gate_logit_normalizer
        self.slot_gate = nn.Linear(self.hidden_size, self.num_kv_heads * self.num_slots, bias=False)

    @classmethod
    def recurrent_state_bytes(cls, options, heads, kv_heads, head_dim):
        """K~ `[H, K, M]` and V~ `[H, M, V]` in fp32."""
        return 2 * kv_heads * head_dim * options.num_slots * 4

    def entry(self, hidden_states):
        """The slot gates' logits `[B, T, H * M]` of the tokens entering the state, in the model's dtype."""
        return self.slot_gate(hidden_states)

    @classmethod
    def entry_bytes(cls, options, heads, kv_heads, head_dim, element_size) -> int:
        return kv_heads * options.num_slots * element_size

    def recur(self, entry, q, k, v, state, output_final_state, cu_seqlens):
        g = F.logsigmoid(entry.float()).view(*entry.shape[:-1], self.num_kv_heads, self.num_slots)
        g = g / self.gate_logit_normalizer
        s = -g.expm1()  # 1 - alpha, computed without cancellation
        return gsa(q, k, v, s, g, scale=self.scaling, initial_state=state, output_final_state=output_final_state,
                   cu_seqlens=cu_seqlens)
