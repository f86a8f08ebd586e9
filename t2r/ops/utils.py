"""Shared helpers of the linear-attention ops: input checks, varlen looping, path choice.

Every check raises ``ValueError`` with a message that names the op, the
offending argument, the expected shape, and what to change.
"""
from typing import Callable, Sequence

import torch
from torch.utils.checkpoint import checkpoint

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

State = torch.Tensor | tuple[torch.Tensor, ...]


def _shape(t: torch.Tensor) -> list:
    return list(t.shape)


def check_qkv(op: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, ...]:
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


def check_state(op: str, name: str, state: torch.Tensor | None, expected: Sequence[int]) -> None:
    """Check a recurrent state (if given) has the `expected` shape."""
    if state is not None and list(state.shape) != list(expected):
        raise ValueError(
            f"{op}: {name} must have shape {list(expected)} (one state per sequence), got "
            f"{_shape(state)}; with cu_seqlens pass one state per packed sequence"
        )


class OffsetsMemo:
    """What was computed from a packed batch's offsets tensor (`cu_seqlens`), kept for the last `keep` (tensor,
    version, key), newest first: every layer of a forward and of its backward passes the same tensor, so work that
    reads its values (a host sync on a GPU) runs once a micro-batch instead of once a layer and pass. An entry holds
    its tensor, so no other tensor can take its memory while listed; an in-place change bumps its version."""

    def __init__(self, keep: int = 4):
        self.keep, self.entries = keep, []

    def get(self, cu_seqlens: torch.Tensor, key, compute: Callable[[], object]):
        """`compute()` for (cu_seqlens, key), or what it gave before for the same tensor, version and key."""
        for cached, version, cached_key, result in self.entries:
            if cached is cu_seqlens and version == cu_seqlens._version and cached_key == key:
                return result
        result = compute()  # an error keeps nothing
        self.entries.insert(0, (cu_seqlens, cu_seqlens._version, key, result))
        del self.entries[self.keep:]
        return result

    def clear(self) -> None:
        self.entries.clear()


_CHECKED_OFFSETS = OffsetsMemo()
"""Offsets whose values passed `check_cu_seqlens` (key: the packed length they were checked against)."""


def check_cu_seqlens(op: str, cu_seqlens: torch.Tensor | None, batch: int,
                     seq_len: int) -> int:
    """Validate packed-sequence offsets; return the number of sequences (the batch if None).

    The offsets' values (0 first, `seq_len` last, strictly increasing) are read once per tensor and version, and
    not under torch.compile, where reading them would break the graph at every op: there only their shape is
    checked (a training run's offsets are `t2r.data.collate_packed`'s)."""
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
    if torch.compiler.is_compiling():
        return cu_seqlens.numel() - 1
    return _CHECKED_OFFSETS.get(cu_seqlens, seq_len, lambda: _check_offset_values(op, cu_seqlens, seq_len))


def _check_offset_values(op: str, cu_seqlens: torch.Tensor, seq_len: int) -> int:
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


def default_scale(scale: float | None, head_dim: int) -> float:
    """The attention scale, K**-0.5 unless given."""
    return head_dim ** -0.5 if scale is None else scale


def _state_row(state: State | None, i: int) -> State | None:
    if state is None:
        return None
    if isinstance(state, tuple):
        return tuple(s[i:i + 1] for s in state)
    return state[i:i + 1]


def _cat_states(states: list) -> State:
    if isinstance(states[0], tuple):
        return tuple(torch.cat(parts, dim=0) for parts in zip(*states))
    return torch.cat(states, dim=0)


def segment_ids(cu_seqlens: torch.Tensor, length: int) -> torch.Tensor:
    """[1, length] index of the packed sequence each position belongs to."""
    positions = torch.arange(length, device=cu_seqlens.device)
    return torch.searchsorted(cu_seqlens[1:].to(positions.dtype), positions, right=True)[None]


def map_over_sequences(fn: Callable, tensors: Sequence[torch.Tensor],
                       initial_state: State | None, output_final_state: bool,
                       cu_seqlens: torch.Tensor | None, segmented: bool = False):
    """Run `fn(*tensors, initial_state=, output_final_state=)` once per packed sequence.

    Without cu_seqlens this is one plain call. With it and a `segmented` fn (one that takes
    `segments=`, `segment_ids`, and keeps sequences apart itself) and neither initial nor final
    states, one call over the packed row. Otherwise the sequences [cu_seqlens[i], cu_seqlens[i+1])
    run as rows of padded batches, never crossing a boundary, with state row i; outputs come back in
    packed order and final states along the sequence axis. Sequences of similar length share a batch
    (`_length_groups`): right padding with zeros is inert for every op of this package (a zero key or
    write adds nothing, a zero log gate keeps the state), so outputs and final states are those of
    each sequence alone, and one call per group replaces one per sequence.
    """
    if cu_seqlens is None:
        return fn(*tensors, initial_state=initial_state, output_final_state=output_final_state)
    if segmented and initial_state is None and not output_final_state:
        return fn(*tensors, initial_state=None, output_final_state=False,
                  segments=segment_ids(cu_seqlens, tensors[0].shape[1]))
    bounds = cu_seqlens.tolist()
    lengths = [end - start for start, end in zip(bounds[:-1], bounds[1:])]
    outputs, finals = [None] * len(lengths), [None] * len(lengths)
    for group in _length_groups(lengths):
        rows = [[t[0, bounds[i]:bounds[i + 1]] for i in group] for t in tensors]
        batch = [torch.nn.utils.rnn.pad_sequence(parts, batch_first=True) for parts in rows] \
            if len(group) > 1 else [parts[0].unsqueeze(0) for parts in rows]
        state = None if initial_state is None else _take_rows(initial_state, group)
        o, final = fn(*batch, initial_state=state, output_final_state=output_final_state)
        for row, i in enumerate(group):
            outputs[i] = o[row:row + 1, :lengths[i]]
            finals[i] = _state_row(final, row) if output_final_state else None
    final_state = _cat_states(finals) if output_final_state else None
    return torch.cat(outputs, dim=1), final_state


def _take_rows(state: State, rows: list) -> State:
    index = torch.tensor(rows, device=(state[0] if isinstance(state, tuple) else state).device)
    if isinstance(state, tuple):
        return tuple(s.index_select(0, index) for s in state)
    return state.index_select(0, index)


def _length_groups(lengths: Sequence[int], max_padding: float = 0.5) -> list:
    """Sequence indices grouped longest first, so that each group padded to its longest member adds
    at most `max_padding` of padding over its real tokens."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups, tokens = [], 0
    for i in order:
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= (1 + max_padding) * (tokens + lengths[i]):
            groups[-1].append(i)
            tokens += lengths[i]
        else:
            groups.append([i])
            tokens = lengths[i]
    return groups


def recompute_in_backward(fn: Callable, *args, **kwargs):
    """`fn(*args, **kwargs)`, keeping only its inputs for the backward pass, which runs it again
    (`torch.utils.checkpoint`). The chunkwise PyTorch forms save [C, C] scores and gate factors per chunk,
    5-10x their inputs; recomputing costs one more forward of the op and keeps training memory near
    softmax attention's. A plain call when nothing needs a gradient, and when saved-tensor hooks already
    decide what is kept (`saved_tensors_managed`): inside a checkpointed decoder layer the op would
    otherwise run three times (forward, the layer's recompute, its own recompute) to spare memory that
    the layer's recompute holds for one layer only."""
    if needs_grad(*args, *kwargs.values()) and not saved_tensors_managed():
        return checkpoint(fn, *args, use_reentrant=False, **kwargs)
    return fn(*args, **kwargs)


def saved_tensors_managed() -> bool:
    """True inside `torch.autograd.graph.saved_tensors_hooks` (activation checkpointing's forward and
    recompute, CPU offloading): the enclosing code decides what autograd keeps."""
    return torch._C._autograd._top_saved_tensors_default_hooks(False) is not None


def needs_grad(*values) -> bool:
    """True when autograd is on and a tensor among `values` (or inside a tuple/list of them) requires grad."""
    if not torch.is_grad_enabled():
        return False
    flat = [t for v in values for t in (v if isinstance(v, (tuple, list)) else (v,))]
    return any(isinstance(t, torch.Tensor) and t.requires_grad for t in flat)


def prefer_recurrent(seq_len: int, *tensors: State | None) -> bool:
    """True for short inputs without autograd (decoding): the step loop beats chunking."""
    return seq_len <= RECURRENT_MAX_LEN and not needs_grad(*tensors)
