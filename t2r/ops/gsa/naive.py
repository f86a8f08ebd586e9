"""Reference Gated Slot Attention: the GSA paper's two-pass recurrence (eq. 6-7), in fp32.

With M memory slots per head, slot write weights s_t and log decays g_t in R^M:

    K~_t = Diag(exp g_t) K~_{t-1} + s_t k_t^T          (M x K, stored transposed as [K, M])
    o'_t = softmax(scale * K~_t q_t)                   over the M slots
    V~_t = Diag(exp g_t) V~_{t-1} + s_t v_t^T          (M x V)
    o_t  = V~_t^T o'_t

Query head i reads kv head i // (HQ // H) (GQA).
"""

import torch

__all__ = ["naive_recurrent_gsa"]


def naive_recurrent_gsa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    s: torch.Tensor,
    g: torch.Tensor,
    scale: float | None = None,
    initial_state: tuple[torch.Tensor, torch.Tensor] | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """q [B,T,HQ,K], k [B,T,H,K], v [B,T,H,V], s/g [B,T,H,M]
    -> (o [B,T,HQ,V], (K~ [B,H,K,M], V~ [B,H,M,V]) fp32 or None)."""
    B, T, HQ, K = q.shape
    H, V, M = v.shape[2], v.shape[3], s.shape[3]
    scale = K ** -0.5 if scale is None else scale
    out_dtype = v.dtype
    q = q.float().view(B, T, H, HQ // H, K) * scale
    k, v, s, g = k.float(), v.float(), s.float(), g.float()
    if initial_state is None:
        Ks, Vs = q.new_zeros(B, H, K, M), q.new_zeros(B, H, M, V)
    else:
        Ks, Vs = initial_state[0].float(), initial_state[1].float()
    outputs = []
    for t in range(T):
        decay = g[:, t].exp()                                                  # [B, H, M]
        Ks = Ks * decay[:, :, None, :] + k[:, t, :, :, None] * s[:, t, :, None, :]
        slots = torch.einsum("bhgk,bhkm->bhgm", q[:, t], Ks).softmax(dim=-1)  # o'_t
        Vs = Vs * decay[:, :, :, None] + s[:, t, :, :, None] * v[:, t, :, None, :]
        outputs.append(torch.einsum("bhgm,bhmv->bhgv", slots, Vs).reshape(B, HQ, V))
    o = torch.stack(outputs, dim=1).to(out_dtype)
    return o, ((Ks, Vs) if output_final_state else None)
