"""Reference sliding-window + sink softmax attention: the full visibility matrix, written out.

Key j is visible to query i (StreamingLLM's sinks, Xiao et al. 2024; LoLCATs' window, Zhang et al. 2025) iff
    j is i itself, or
    j is a real token of i's document at or before i (q_abs - k_abs == q_pos - k_pos >= 0), and
        it is one of the document's first `sinks` tokens (k_pos < sinks), or
        it lies inside the window of the `window` most recent tokens (q_pos - k_pos < window).
`*_abs` are indices in the stream (cache slots included), `*_pos` positions inside each document (they restart
at 0 for every packed document; left padding does not count). A padded query sees only itself (finite output).
Memory is O(Tq x Tk): the ground truth of the chunked form, and the decode path (Tk = sinks + window + Tq).
"""

import torch


def visible_keys(q_abs, q_pos, k_abs, k_pos, k_real, window: int, sinks: int) -> torch.Tensor:
    """`[B, Tq, Tk]` bool: which key each query reads (the rule in the module docstring)."""
    back = q_abs[:, :, None] - k_abs[:, None, :]
    same_document = (back >= 0) & (back == q_pos[:, :, None] - k_pos[:, None, :])
    in_reach = (k_pos[:, None, :] < sinks) | (back < window)
    return (back == 0) | (k_real[:, None, :] & same_document & in_reach)


def masked_window_attention(q, k, v, *, q_abs, q_pos, k_abs, k_pos, k_real, window: int, sinks: int,
                            scale: float) -> torch.Tensor:
    """q `[B,Tq,HQ,D]`, k/v `[B,Tk,H,D]`, index tensors `[B,Tq]` / `[B,Tk]` -> o `[B,Tq,HQ,D]` (softmax in fp32)."""
    group = q.shape[2] // k.shape[2]
    keys, values = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    logits = torch.einsum("bihd,bjhd->bhij", q, keys).float() * scale
    allowed = visible_keys(q_abs, q_pos, k_abs, k_pos, k_real, window, sinks)[:, None]
    p = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
    return torch.einsum("bhij,bjhd->bihd", p.to(v.dtype), values)


def naive_window_attention(q, k, v, *, positions, real=None, window: int, sinks: int, scale: float) -> torch.Tensor:
    """One call's tokens attending to each other (no cache): q `[B,T,HQ,D]`, k/v `[B,T,H,D]`, positions `[B,T]`
    (inside each document), real `[B,T]` bool (False: padding; None: all real)."""
    batch, length = q.shape[:2]
    index = torch.arange(length, device=q.device).expand(batch, length)
    real = torch.ones(batch, length, dtype=torch.bool, device=q.device) if real is None else real.bool()
    positions = positions.expand(batch, length)
    return masked_window_attention(q, k, v, q_abs=index, q_pos=positions, k_abs=index, k_pos=positions,
                                   k_real=real, window=window, sinks=sinks, scale=scale)
