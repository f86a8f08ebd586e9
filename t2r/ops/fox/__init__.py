"""Forgetting Attention (FoX, Lin et al., 2025): softmax attention with a forget gate.

    o_i = sum_j softmax_j(scale * q_i . k_j + D_ij) v_j,
    D_ij = sum_{l=j+1..p_i} g_l = c_{p_i} - c_j,  c = cumsum(g)      (Eq. 11, Sec. 3)

`g` holds log forget gates (<= 0). Queries sit at the last Tq key positions
(bottom-right causal), so the same call serves training (Tq == Tk) and
decoding against a KV cache (Tq small).
"""

import torch

from ..utils import check_cu_seqlens
from .chunk import chunk_forgetting_attention
from .naive import naive_forgetting_attention

__all__ = ["forgetting_attention", "chunk_forgetting_attention", "naive_forgetting_attention"]


def _check_inputs(q, k, v, g, attention_mask, cu_seqlens) -> None:
    """Raise ValueError naming the problem and the fix."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D [batch, seq, heads, dim], got shape {tuple(t.shape)}")
    B, Tq, HQ, K = q.shape
    _, Tk, H, _ = k.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"batch sizes differ: q {B}, k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[-1] != K:
        raise ValueError(f"q and k head dims differ ({K} vs {k.shape[-1]}); they must match")
    if v.shape[1:3] != k.shape[1:3]:
        raise ValueError(
            f"k {tuple(k.shape)} and v {tuple(v.shape)} must share [seq, heads]; pass matching caches"
        )
    if HQ % H != 0:
        raise ValueError(
            f"query heads ({HQ}) must be a multiple of kv heads ({H}) for GQA; "
            "check num_attention_heads / num_key_value_heads"
        )
    if tuple(g.shape) != (B, Tk, HQ):
        raise ValueError(
            f"g must be [batch, Tk, query_heads] = {(B, Tk, HQ)} (one log gate per query head "
            f"and key position), got {tuple(g.shape)}"
        )
    if Tq > Tk:
        raise ValueError(
            f"more queries ({Tq}) than keys ({Tk}); queries are aligned to the last Tq keys, "
            "so append the new tokens' k/v/g to the cache before calling"
        )
    if attention_mask is not None and tuple(attention_mask.shape) != (B, Tk):
        raise ValueError(
            f"attention_mask must be [batch, Tk] = {(B, Tk)} (1 = token, 0 = padding), "
            f"got {tuple(attention_mask.shape)}"
        )
    if cu_seqlens is not None:
        if B != 1:
            raise ValueError(f"cu_seqlens needs batch size 1 (documents packed along seq), got {B}")
        if Tq != Tk:
            raise ValueError(f"cu_seqlens needs Tq == Tk (packed training), got Tq={Tq}, Tk={Tk}")
        check_cu_seqlens("forgetting_attention", cu_seqlens, B, Tk)  # values once a tensor, none under compile


def forgetting_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    *,
    scale: float | None = None,
    attention_mask: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Forgetting Attention. q [B,Tq,HQ,K], k [B,Tk,H,K], v [B,Tk,H,V], g [B,Tk,HQ].

    HQ % H == 0 (query head i uses kv head i // (HQ // H)); Tq <= Tk with the
    queries at positions Tk-Tq..Tk-1. `scale` defaults to K**-0.5.
    `attention_mask` [B,Tk] (1 = token, 0 = padding) hides padded keys; rows
    that see no key return zeros. `cu_seqlens` [N+1] (B == 1, Tq == Tk) packs
    N documents with no attention across them. Returns o [B,Tq,HQ,V] in v's dtype.
    """
    _check_inputs(q, k, v, g, attention_mask, cu_seqlens)
    kwargs = dict(scale=scale, attention_mask=attention_mask, cu_seqlens=cu_seqlens)
    # Triton kernel (t2r/ops/fox/triton_parallel.py) when the backend picks Triton and the
    # kernel covers the call (head dims powers of two <= 128, one dtype for q/k/v); the
    # PyTorch chunk form otherwise.
    from t2r.ops.backend import use_triton
    if use_triton(q, k, v, g):
        from .triton_parallel import parallel_forgetting_attention_triton, supports
        if supports(q, k, v, g, cu_seqlens=cu_seqlens, attention_mask=attention_mask):
            return parallel_forgetting_attention_triton(q, k, v, g, **kwargs)
    return chunk_forgetting_attention(q, k, v, g, **kwargs)
