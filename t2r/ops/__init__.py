"""Sequence-mixing ops: gated linear attention (GLA), simple GLA / RetNet, gated slot attention (GSA),
forgetting attention (FoX), the gated delta rule (Gated DeltaNet).

Each op has three forms: a step-by-step reference (`naive_recurrent_*`, fp32,
the ground truth of the tests), a chunkwise PyTorch form (`chunk_*`, matmul
based, any device, autograd), and a public function that picks a backend
(`t2r.ops.backend`). Tensors are laid out [batch, seq_len, heads, dim], gates
are log-space decays (<= 0), states are fp32.
"""
from .backend import use_triton
from .fox import chunk_forgetting_attention, forgetting_attention, naive_forgetting_attention
from .gated_delta import chunk_gated_delta_rule, gated_delta_rule, naive_recurrent_gated_delta_rule
from .gla import chunk_gla, gla, naive_recurrent_gla
from .gsa import chunk_gsa, gsa, naive_recurrent_gsa
from .simple_gla import chunk_simple_gla, naive_recurrent_simple_gla, simple_gla

__all__ = [
    "use_triton",
    "gla", "chunk_gla", "naive_recurrent_gla",
    "simple_gla", "chunk_simple_gla", "naive_recurrent_simple_gla",
    "gsa", "chunk_gsa", "naive_recurrent_gsa",
    "forgetting_attention", "chunk_forgetting_attention", "naive_forgetting_attention",
    "gated_delta_rule", "chunk_gated_delta_rule", "naive_recurrent_gated_delta_rule",
]
