"""Shared helpers of the linear-attention ops: input checks, varlen looping, path choice.

Every check raises ``ValueError`` with a message that names the op, the
offending argument, the expected shape, and what to change.
"""
from typing import Callable, Optional, Sequence, Tuple, Union

import torch

__all__ = [
    "RECURRENT_MAX_LEN",
    "State",
    "check_qkv",
    "check_gate",
    "check_state",
    "check_cu_seqlens",
    "default_scale",
    "map_over_sequences",
    "prefer_recurrent",
]

# Up to this many steps without autograd (decoding), the step-by-step loop is
# cheaper than padding to a whole chunk.
RECURRENT_MAX_LEN = 4

State = Union[torch.Tensor, Tuple[torch.Tensor, ...]]


def _shape(t: torch.Tensor) -> list:
    return list(t.shape)


def check_qkv(op: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Tuple[int, ...]:
    """Check q [B,T,HQ,K], k [B,T,H,K], v [B,T,H,V] with HQ % H == 0; return (B, T, HQ, H, K, V)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(
                f"{op}: {name} must be 4-D [batch, seq_len, heads, head_dim], got shape {_shape(t)}"
            )
    B, T, HQ, K = q.shape
    H, V = v.shape[2], v.shape[3]
    if list(k.shape[:2]) != [B, T] or list(v.shape[:2]) != [B, T]:
        raise ValueError(
            f"{op}: q {_shape(q)}, k {_shape(k)} and v {_shape(v)} must share [batch, seq_len]"
        )
    if T < 1:
        raise ValueError(f"{op}: seq_len must be at least 1, got inputs of shape {_shape(q)}")
    if k.shape[3] != K:
        raise ValueError(
            f"{op}: q and k must have the same head_dim, got {K} and {k.shape[3]}"
        )
    if k.shape[2] != H:
        raise ValueError(
            f"{op}: k has {k.shape[2]} heads but v has {H}; keys and values need the same heads"
        )
    if HQ % H != 0:
        raise ValueError(
            f"{op}: q has {HQ} heads, not a multiple of the {H} key/value heads; with GQA "
            f"the query heads must be a whole number of groups (e.g. {H * max(1, HQ // H)})"
        )
    return B, T, HQ, H, K, V


def check_gate(op: str, name: str, gate: torch.Tensor, expected: Sequence[int], meaning: str,
               hint: str = "") -> None:
    """Check a gate-like tensor has exactly the `expected` shape."""
    if list(gate.shape) != list(expected):
        raise ValueError(
            f"{op}: {name} must have shape {list(expected)} ({meaning}), got {_shape(gate)}"
            + (f"; {hint}" if hint else "")
        )


def check_state(op: str, name: str, state: Optional[torch.Tensor], expected: Sequence[int]) -> None:
    """Check a recurrent state (if given) has the `expected` shape."""
    if state is not None and list(state.shape) != list(expected):
        raise ValueError(
            f"{op}: {name} must have shape {list(expected)} (one state per sequence), got "
            f"{_shape(state)}; with cu_seqlens pass one state per packed sequence"
        )


def check_cu_seqlens(op: str, cu_seqlens: Optional[torch.Tensor], batch: int,
                     seq_len: int) -> int:
    """Validate packed-sequence offsets; return the number of sequences (the batch if None)."""
    if cu_seqlens is None:
        return batch
    if batch != 1:
        raise ValueError(
            f"{op}: cu_seqlens packs sequences along the time axis and needs batch size 1, "
            f"got batch {batch}; concatenate the sequences into shape [1, total_len, ...]"
        )
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2 or cu_seqlens.is_floating_point():
        raise ValueError(
            f"{op}: cu_seqlens must be a 1-D integer tensor [num_seqs + 1] of offsets, got "
            f"dtype {cu_seqlens.dtype} and shape {_shape(cu_seqlens)}"
        )
    bounds = cu_seqlens.tolist()
    if bounds[0] != 0 or bounds[-1] != seq_len:
        raise ValueError(
            f"{op}: cu_seqlens must start at 0 and end at the packed length {seq_len}, "
            f"got {bounds[0]} ... {bounds[-1]}"
        )
    if any(b <= a for a, b in zip(bounds[:-1], bounds[1:])):
        raise ValueError(
            f"{op}: cu_seqlens must be strictly increasing (no empty sequences), got {bounds}"
        )
    return len(bounds) - 1


def default_scale(scale: Optional[float], head_dim: int) -> float:
    """The attention scale, K**-0.5 unless given."""
    return head_dim ** -0.5 if scale is None else scale


def _state_row(state: Optional[State], i: int) -> Optional[State]:
    if state is None:
        return None
    if isinstance(state, tuple):
        return tuple(s[i:i + 1] for s in state)
    return state[i:i + 1]


def _cat_states(states: list) -> State:
    if isinstance(states[0], tuple):
        return tuple(torch.cat(parts, dim=0) for parts in zip(*states))
    return torch.cat(states, dim=0)


def map_over_sequences(fn: Callable, tensors: Sequence[torch.Tensor],
                       initial_state: Optional[State], output_final_state: bool,
                       cu_seqlens: Optional[torch.Tensor]):
    """Run `fn(*tensors, initial_state=, output_final_state=)` once per packed sequence.

    Without cu_seqlens this is one plain call. With it, each sequence
    [cu_seqlens[i], cu_seqlens[i+1]) runs on its own (so nothing crosses a
    boundary) with state row i; outputs are concatenated along time and final
    states along the sequence axis.
    """
    if cu_seqlens is None:
        return fn(*tensors, initial_state=initial_state, output_final_state=output_final_state)
    bounds = cu_seqlens.tolist()
    outputs, finals = [], []
    for i, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        o, final = fn(*(t[:, start:end] for t in tensors),
                      initial_state=_state_row(initial_state, i),
                      output_final_state=output_final_state)
        outputs.append(o)
        finals.append(final)
    final_state = _cat_states(finals) if output_final_state else None
    return torch.cat(outputs, dim=1), final_state


def prefer_recurrent(seq_len: int, *tensors: Optional[State]) -> bool:
    """True for short inputs without autograd (decoding): the step loop beats chunking."""
    if seq_len > RECURRENT_MAX_LEN:
        return False
    if not torch.is_grad_enabled():
        return True
    flat = []
    for t in tensors:
        flat.extend(t if isinstance(t, tuple) else [t])
    return not any(t is not None and t.requires_grad for t in flat)
