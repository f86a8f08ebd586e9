"""Blockwise Forgetting Attention in PyTorch: the CPU path and the GPU fallback.

Same maths as `naive.py` (FoX Eq. 11, D_ij = c_i - c_j with c = cumsum(log f),
Sec. 3), but queries are processed in blocks of `block_size` rows, each block
only against the keys it can see, through `scaled_dot_product_attention` with
a float bias mask. Each block runs under activation checkpointing when grads
are needed, so forward and backward both hold O(block_size x Tk) scores
instead of O(Tq x Tk); the price is one recomputed forward per block.
GQA is handled by folding the G query heads of a kv head into the query rows,
so k/v are never repeated. Everything is computed in fp32 and cast back.
"""

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def _gate_cumsum(g: torch.Tensor, cu_seqlens: torch.Tensor | None) -> torch.Tensor:
    """c_t = sum_{l<=t} g_l in fp32, restarted at each packed document start.

    Restarting keeps |c| small within a document, so c_i - c_j stays accurate
    for long packed batches (cross-document pairs are masked out anyway).
    """
    if cu_seqlens is None:
        return g.float().cumsum(1)
    c = g.double().cumsum(1)                                    # fp64 so the subtraction is exact enough
    keys = torch.arange(g.shape[1], device=g.device)
    doc = torch.searchsorted(cu_seqlens[1:], keys, right=True)
    before = F.pad(c, (0, 0, 1, 0))[:, cu_seqlens[doc]]          # sum of g before each doc start
    return (c - before).float()


def _block(q, k, v, cq, ck, qpos, kpos, kmask, qdoc, kdoc, scale):
    """One query block. q [B,bt,H,G,K]; k, v [B,H,n,*]; cq [B,H,G,bt]; ck [B,H,G,n].

    qpos/kpos are absolute positions, kmask [B,n] the padding mask or None,
    qdoc/kdoc document ids or None. Returns o [B,bt,H*G,V] in fp32.
    """
    B, bt, H, G, K = q.shape
    n, V = k.shape[2], v.shape[3]
    allowed = kpos[None, :] <= qpos[:, None]                    # causal, [bt, n]
    if qdoc is not None:
        allowed = allowed & (qdoc[:, None] == kdoc[None, :])
    allowed = allowed[None]
    if kmask is not None:
        allowed = allowed & kmask[:, None, :]                   # [B, bt, n]
    allowed = allowed[:, None, None]                            # [B|1, 1, 1, bt, n]
    empty = ~allowed.any(-1, keepdim=True)                      # rows that see no key
    bias = (cq[..., :, None] - ck[..., None, :])                # D_ij, [B,H,G,bt,n]
    bias = bias.masked_fill(~allowed, float("-inf")).masked_fill(empty, 0.0)
    qh = q.permute(0, 2, 3, 1, 4).reshape(B, H, G * bt, K)
    o = F.scaled_dot_product_attention(
        qh, k, v, attn_mask=bias.reshape(B, H, G * bt, n), scale=scale
    )
    o = o.view(B, H, G, bt, V).masked_fill(empty, 0.0)         # zeros, not NaN/uniform
    return o.permute(0, 3, 1, 2, 4).reshape(B, bt, H * G, V)


def chunk_forgetting_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    *,
    scale: float | None = None,
    attention_mask: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    block_size: int = 128,
) -> torch.Tensor:
    """q [B,Tq,HQ,K], k [B,Tk,H,K], v [B,Tk,H,V], g [B,Tk,HQ] -> o [B,Tq,HQ,V].

    Queries are the last Tq positions (bottom-right causal). No input checks:
    call through `t2r.ops.forgetting_attention` for validation.
    """
    B, Tq, HQ, K = q.shape
    Tk, H = k.shape[1], k.shape[2]
    G, off = HQ // H, Tk - Tq
    scale = K ** -0.5 if scale is None else scale
    dev = q.device

    c = _gate_cumsum(g, cu_seqlens).view(B, Tk, H, G).permute(0, 2, 3, 1)   # [B,H,G,Tk]
    qf = q.float().view(B, Tq, H, G, K)
    kf, vf = k.float().transpose(1, 2), v.float().transpose(1, 2)          # [B,H,Tk,*]
    kmask = None if attention_mask is None else attention_mask.bool()
    pos = torch.arange(Tk, device=dev)

    starts = list(range(0, Tq, block_size))
    doc, lows = None, [0] * len(starts)
    if cu_seqlens is not None:                                  # Tq == Tk here: skip earlier documents
        doc = torch.searchsorted(cu_seqlens[1:], pos, right=True)
        lows = cu_seqlens[doc[torch.tensor(starts, device=dev)]].tolist()

    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, g))
    outs = []
    for i0, lo in zip(starts, lows):
        i1 = min(i0 + block_size, Tq)
        hi = off + i1                                           # keys [lo, hi) are visible
        args = (
            qf[:, i0:i1], kf[:, :, lo:hi], vf[:, :, lo:hi],
            c[..., off + i0:hi], c[..., lo:hi],
            pos[off + i0:hi], pos[lo:hi],
            None if kmask is None else kmask[:, lo:hi],
            None if doc is None else doc[off + i0:hi],
            None if doc is None else doc[lo:hi],
            scale,
        )
        outs.append(checkpoint(_block, *args, use_reentrant=False) if grad else _block(*args))
    if not outs:                                                # Tq == 0
        return v.new_zeros(B, 0, HQ, v.shape[-1])
    return torch.cat(outs, dim=1).to(v.dtype)
