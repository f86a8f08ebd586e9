"""RetNet-style retention: linear attention with a fixed per-head decay (Sun et al. 2023, eq. 1).

S_t = gamma_h S_{t-1} + k_t v_t^T with gamma_h = 1 - 2^(-5 - h): no new parameter at all.
"""

import math

import torch
from transformers import initialization as init

from t2r.layers.base import RecurrentMixer, with_denominator
from t2r.ops.simple_gla import simple_gla


def retention_log_decays(num_heads: int) -> torch.Tensor:
    """log gamma_h for h = 0..H-1, RetNet's multi-scale decays."""
    return torch.tensor([math.log(1 - 2 ** (-5 - h)) for h in range(num_heads)], dtype=torch.float32)


class RetentionAttention(RecurrentMixer):
    target = "retnet"

    def __init__(self, attention, config, layer_idx, options):
        super().__init__(attention, config, layer_idx, options)
        self.register_buffer("log_decay", retention_log_decays(self.num_kv_heads), persistent=False)

    def init_parameters(self, std: float) -> None:
        """Recompute the (non-persistent) decays when the model is materialised from the meta device."""
        init.copy_(self.log_decay, retention_log_decays(self.num_kv_heads))

    def entry(self, hidden_states):
        """Nothing: the decays are fixed."""
        return None

    @classmethod
    def entry_bytes(cls, options, heads, kv_heads, head_dim, element_size) -> int:
        return 0

    def recur(self, entry, q, k, v, state, output_final_state, cu_seqlens):
        batch, length = q.shape[:2]
        g = self.log_decay.to(q.device).expand(batch, length, -1)

        def run(v):
            return simple_gla(q, k, v, g, scale=self.scaling, initial_state=state,
                              output_final_state=output_final_state, cu_seqlens=cu_seqlens)
        return with_denominator(run, v) if self.options.denominator else run(v)
