"""Reference GLA: the recurrence of the GLA paper (eq. 3), one step at a time, in fp32.

    S_t = Diag(exp g_t) S_{t-1} + k_t v_t^T      S_t in R^{K x V} per kv head
    o_t = scale * S_t^T q_t

Query heads are grouped onto kv heads (GQA): query head i reads kv head
i // (HQ // H). This is the ground truth the chunkwise form and the Triton
kernels are tested against; it is slow (a Python loop over time) on purpose.
"""

import torch

__all__ = ["naive_recurrent_gla"]


def naive_recurrent_gla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q [B,T,HQ,K], k/g [B,T,H,K], v [B,T,H,V] -> (o [B,T,HQ,V], final state [B,H,K,V] fp32 or None)."""
    B, T, HQ, K = q.shape
    H, V = v.shape[2], v.shape[3]
    scale = K ** -0.5 if scale is None else scale
    out_dtype = v.dtype
    q = q.float().view(B, T, H, HQ // H, K) * scale
    k, v, g = k.float(), v.float(), g.float()
    S = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.float()
    outputs = []
    for t in range(T):
        S = g[:, t].exp()[..., None] * S + k[:, t, :, :, None] * v[:, t, :, None, :]
        outputs.append(torch.einsum("bhgk,bhkv->bhgv", q[:, t], S).reshape(B, HQ, V))
    o = torch.stack(outputs, dim=1).to(out_dtype)
    return o, (S if output_final_state else None)
