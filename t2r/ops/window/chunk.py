"""Chunked sliding-window + sink attention: O(T (block + window + sinks)) time and memory, plain PyTorch.

Queries go in blocks of `block`; a block reads the `window` keys before it and its own (one unfolded view of
the keys), plus each query's own document sinks, gathered per query (a packed row holds several documents, so
sinks differ by query). One softmax runs over both sets, so the result is exactly `naive_window_attention`:
window keys that are sinks are left to the sink set, so no key counts twice.
"""

import torch
import torch.nn.functional as F


def _blocks(x: torch.Tensor, window: int, block: int, length: int, fill=0) -> torch.Tensor:
    """`[B, T, ...]` -> `[B, nb, window + block, ...]`: for block n, stream indices n*block - window .. (n+1)*block."""
    padded_length = -(-length // block) * block
    pad = [0, 0] * (x.dim() - 2) + [window, padded_length - length]
    unfolded = F.pad(x, pad, value=fill).unfold(1, window + block, block)  # [B, nb, ..., window + block]
    return unfolded.movedim(-1, 2)


def chunk_window_attention(q, k, v, *, positions, real=None, window: int, sinks: int, scale: float,
                           block: int = 64) -> torch.Tensor:
    """Same arguments and result as `naive_window_attention` (softmax in fp32)."""
    batch, length, heads_q, dim = q.shape
    heads, group = k.shape[2], heads_q // k.shape[2]
    device = q.device
    real = torch.ones(batch, length, dtype=torch.bool, device=device) if real is None else real.bool()
    positions = positions.expand(batch, length).long()
    index = torch.arange(length, device=device).expand(batch, length)
    padded_length = -(-length // block) * block
    blocks = padded_length // block

    # window part: keys of the block and the `window` before it whose in-document position is past the sinks
    qb = F.pad(q, [0, 0, 0, 0, 0, padded_length - length]).view(batch, blocks, block, heads, group, dim)
    kb, vb = _blocks(k, window, block, length), _blocks(v, window, block, length)
    k_abs = _blocks(index, window, block, length, fill=-1)
    k_pos, k_real = _blocks(positions, window, block, length), _blocks(real, window, block, length, fill=False)
    q_abs = F.pad(index, [0, padded_length - length], value=-1).view(batch, blocks, block)
    q_pos = F.pad(positions, [0, padded_length - length]).view(batch, blocks, block)
    q_real = F.pad(real, [0, padded_length - length], value=False).view(batch, blocks, block)
    back = q_abs[..., :, None] - k_abs[..., None, :]
    same_document = (back >= 0) & (back == q_pos[..., :, None] - k_pos[..., None, :])
    visible = k_real[..., None, :] & same_document & (back < window) & (k_pos[..., None, :] >= sinks)
    visible = visible | ((back == 0) & ~q_real[..., :, None])  # a padded query reads itself only
    logits = torch.einsum("bnqhgd,bnkhd->bnhgqk", qb, kb).float() * scale
    logits = logits.masked_fill(~visible[:, :, None, None], float("-inf"))
    if sinks:
        # sink part: query i reads stream index i - pos_i + m for m < sinks, m <= pos_i (its document's start)
        m = torch.arange(sinks, device=device)
        sink_index = (index - positions)[..., None] + m                                  # [B, T, S]
        sink_ok = real[..., None] & (m <= positions[..., None]) & (sink_index >= 0)
        sink_index = sink_index.clamp(0, length - 1)

        def gather(x):
            return x.gather(1, sink_index.view(batch, -1, 1, 1).expand(-1, -1, heads, dim)).view(
                batch, length, sinks, heads, dim)

        k_sink, v_sink = gather(k), gather(v)
        q_groups = q.view(batch, length, heads, group, dim)
        sink_logits = torch.einsum("bthgd,btshd->bhgts", q_groups, k_sink).float() * scale
        sink_logits = sink_logits.masked_fill(~sink_ok[:, None, None], float("-inf"))
        sink_logits = F.pad(sink_logits, [0, 0, 0, padded_length - length], value=float("-inf"))
        sink_logits = sink_logits.view(batch, heads, group, blocks, block, sinks).movedim(3, 1)
        logits = torch.cat([logits, sink_logits], dim=-1)
    p = torch.softmax(logits, dim=-1)
    p = torch.nan_to_num(p)  # rows past the end of the sequence (block padding) see nothing
    o = torch.einsum("bnhgqk,bnkhd->bnqhgd", p[..., : window + block].to(v.dtype), vb)
    o = o.reshape(batch, padded_length, heads_q, dim)[:, :length]
    if sinks:
        p_sink = p[..., window + block:].movedim(1, 3).reshape(batch, heads, group, padded_length, sinks)
        o = o + torch.einsum("bhgts,btshd->bthgd", p_sink[:, :, :, :length].to(v.dtype), v_sink).reshape(
            batch, length, heads_q, dim)
    return o
