"""Reference simple GLA: GLA with one scalar decay per head and step, in fp32.

    S_t = exp(g_t) S_{t-1} + k_t v_t^T,     o_t = scale * S_t^T q_t

A constant g gives RetNet's retention (gamma = exp g); a data-dependent g gives
Mamba-2 / gated retention style decays (GLA paper, Table 1, G_t = gamma_t 1^T 1).
Query head i reads kv head i // (HQ // H) (GQA).
"""

import torch

__all__ = ["naive_recurrent_simple_gla"]


def naive_recurrent_simple_gla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q [B,T,HQ,K], k [B,T,H,K], v [B,T,H,V], g [B,T,H] -> (o [B,T,HQ,V], state [B,H,K,V] fp32 or None)."""
    B, T, HQ, K = q.shape
    H, V = v.shape[2], v.shape[3]
    scale = K ** -0.5 if scale is None else scale
    out_dtype = v.dtype
    q = q.float().view(B, T, H, HQ // H, K) * scale
    k, v, g = k.float(), v.float(), g.float()
    S = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.float()
    outputs = []
    for t in range(T):
        S = g[:, t].exp()[..., None, None] * S + k[:, t, :, :, None] * v[:, t, :, None, :]
        outputs.append(torch.einsum("bhgk,bhkv->bhgv", q[:, t], S).reshape(B, HQ, V))
    o = torch.stack(outputs, dim=1).to(out_dtype)
    return o, (S if output_final_state else None)
