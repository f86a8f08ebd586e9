"""Chunkwise Gated Slot Attention: two gated linear attention passes linked by a softmax.

GSA paper eq. 6-7 split into two GLA recurrences that the shared engine
(`t2r.ops.common.chunk`) runs chunkwise:

* pass 1, state K~ [K, M]: queries q, keys k, "values" s, decay g on the value
  (slot) side; its output is the slot logits scale * K~_t q_t;
* softmax over the M slots gives o'_t;
* pass 2, state V~ [M, V]: queries o' (HQ heads, dim M), keys s, values v, decay g
  on the key (slot) side, scale 1.

Both passes keep the GQA grouping: o' has HQ heads and reads the shared V~.
"""

import torch

from ..common.chunk import chunk_gated_linear_attention
from ..utils import (
    check_cu_seqlens,
    check_gate,
    check_qkv,
    check_state,
    default_scale,
    map_over_sequences,
    recompute_in_backward,
)

__all__ = ["chunk_gsa", "check_gsa_inputs"]

GSAState = tuple[torch.Tensor, torch.Tensor]


def check_gsa_inputs(op: str, q, k, v, s, g, initial_state, cu_seqlens) -> tuple[int, ...]:
    """Validate gsa arguments; return (B, T, HQ, H, K, V, M)."""
    B, T, HQ, H, K, V = check_qkv(op, q, k, v)
    if s.dim() != 4 or list(s.shape[:3]) != [B, T, H]:
        raise ValueError(
            f"{op}: s must have shape [B, T, H, M] = [{B}, {T}, {H}, M] (slot write weights per "
            f"kv head), got {list(s.shape)}"
        )
    M = s.shape[3]
    check_gate(op, "g", g, [B, T, H, M], "one log decay per slot, same shape as s")
    n_seqs = check_cu_seqlens(op, cu_seqlens, B, T)
    if initial_state is not None:
        if not isinstance(initial_state, (tuple, list)) or len(initial_state) != 2:
            raise ValueError(
                f"{op}: initial_state must be a pair (key slots [N, H, K, M], value slots "
                f"[N, H, M, V]), got {type(initial_state).__name__}"
            )
        check_state(op, "initial_state[0] (key slots)", initial_state[0], [n_seqs, H, K, M])
        check_state(op, "initial_state[1] (value slots)", initial_state[1], [n_seqs, H, M, V])
    return B, T, HQ, H, K, V, M


def gsa_two_pass(q, k, v, s, g, *, scale: float, initial_state: GSAState | None = None,
                 output_final_state: bool = False, chunk_size: int = 64, segments=None):
    """Both GLA passes for one batch of equal-length rows (`segments`: packed sequences); output in fp32."""
    key_slots, value_slots = (None, None) if initial_state is None else initial_state
    logits, key_slots = chunk_gated_linear_attention(
        q, k, s, gv=g, scale=scale, initial_state=key_slots,
        output_final_state=output_final_state, chunk_size=chunk_size, segments=segments)
    slot_weights = logits.softmax(dim=-1)                                  # o' [B, T, HQ, M]
    o, value_slots = chunk_gated_linear_attention(
        slot_weights, s, v, gk=g, scale=1.0, initial_state=value_slots,
        output_final_state=output_final_state, chunk_size=chunk_size, segments=segments)
    return o, ((key_slots, value_slots) if output_final_state else None)


def chunk_gsa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    s: torch.Tensor,
    g: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: GSAState | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, GSAState | None]:
    """Chunkwise GSA; same contract as `t2r.ops.gsa`."""
    K = check_gsa_inputs("chunk_gsa", q, k, v, s, g, initial_state, cu_seqlens)[4]
    if initial_state is not None:
        initial_state = tuple(initial_state)

    def run(q, k, v, s, g, initial_state, output_final_state, segments=None):
        return recompute_in_backward(gsa_two_pass, q, k, v, s, g, scale=default_scale(scale, K),
                                     initial_state=initial_state, output_final_state=output_final_state,
                                     chunk_size=chunk_size, segments=segments)

    o, final = map_over_sequences(run, (q, k, v, s, g), initial_state, output_final_state, cu_seqlens,
                                  segmented=True)
    return o.to(v.dtype), final
