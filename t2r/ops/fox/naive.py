"""Reference Forgetting Attention: materialise the full logit matrix in fp32.

FoX (Lin et al., 2025), Eq. 11:  O = softmax(Q K^T * scale + D) V  with
D_ij = sum_{l=j+1..i} log f_l = c_i - c_j  and  c = cumsum(log f)  (Sec. 3).
Memory is O(Tq x Tk); this is the ground truth the fast forms are tested against.
"""

import torch


def naive_forgetting_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    *,
    scale: float | None = None,
    attention_mask: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [B,Tq,HQ,K], k [B,Tk,H,K], v [B,Tk,H,V], g [B,Tk,HQ] -> o [B,Tq,HQ,V].

    Queries are the last Tq positions (bottom-right causal). No input checks:
    call through `t2r.ops.forgetting_attention` for validation.
    """
    B, Tq, HQ, K = q.shape
    Tk, H = k.shape[1], k.shape[2]
    scale = K ** -0.5 if scale is None else scale
    kf = k.float().repeat_interleave(HQ // H, dim=2)
    vf = v.float().repeat_interleave(HQ // H, dim=2)
    c = g.float().cumsum(1).transpose(1, 2)                     # [B, HQ, Tk]
    pos = torch.arange(Tk - Tq, Tk, device=q.device)            # absolute query positions
    keys = torch.arange(Tk, device=q.device)
    bias = c[..., pos, None] - c[..., None, :]                   # D = c_i - c_j, [B,HQ,Tq,Tk]
    logits = torch.einsum("bihd,bjhd->bhij", q.float(), kf) * scale + bias

    allowed = (keys[None, :] <= pos[:, None])[None, None]        # [1,1,Tq,Tk]
    if attention_mask is not None:
        allowed = allowed & attention_mask.bool()[:, None, None, :]
    if cu_seqlens is not None:                                   # forbid cross-document pairs
        doc = torch.searchsorted(cu_seqlens[1:], keys, right=True)
        allowed = allowed & (doc[pos][:, None] == doc[None, :])
    empty = ~allowed.any(-1, keepdim=True)                       # rows with no visible key
    logits = logits.masked_fill(~allowed, float("-inf")).masked_fill(empty, 0.0)
    p = torch.softmax(logits, dim=-1).masked_fill(empty, 0.0)
    o = torch.einsum("bhij,bjhd->bihd", p, vf)
    return o.to(v.dtype)
