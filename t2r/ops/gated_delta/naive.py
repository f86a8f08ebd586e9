"""Reference gated delta rule (Gated DeltaNet, Yang, Kautz & Hatamizadeh 2024, arXiv 2412.06464, eq. 10),
one step at a time, in fp32.

With the state S_t in R^{K x V} per kv head (keys index its rows, as in every op of this package):

    S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T
    o_t = scale * S_t^T q_t

(the paper writes the transposed V x K state: S_t = S_{t-1} alpha_t (I - beta_t k_t k_t^T) + beta_t v_t k_t^T,
alpha_t = exp(g_t)). Query head i reads kv head i // (HQ // H) (GQA). This is the ground truth that the
chunkwise form and the Triton kernels are tested against; slow on purpose.
"""

import torch

__all__ = ["naive_recurrent_gated_delta_rule", "gated_delta_rule_step"]


def gated_delta_rule_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of the recurrence, literally: q [B,HQ,K], k [B,H,K], v [B,H,V], g / beta [B,H],
    state [B,H,K,V] fp32 -> (o [B,HQ,V] fp32, new state [B,H,K,V] fp32). Decoding on CPU uses it."""
    B, HQ, K = q.shape
    H, V = v.shape[1], v.shape[2]
    q, k, v, g, beta = (t.float() for t in (q, k, v, g, beta))
    erased = state - beta[..., None, None] * k[..., :, None] * torch.einsum("bhk,bhkv->bhv", k, state)[..., None, :]
    state = g.exp()[..., None, None] * erased + beta[..., None, None] * k[..., :, None] * v[..., None, :]
    o = torch.einsum("bhgk,bhkv->bhgv", q.view(B, H, HQ // H, K) * scale, state).reshape(B, HQ, V)
    return o, state


def naive_recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q [B,T,HQ,K], k [B,T,H,K], v [B,T,H,V], g / beta [B,T,H] -> (o [B,T,HQ,V] in v's dtype,
    final state [B,H,K,V] fp32 or None)."""
    B, T, HQ, K = q.shape
    H, V = v.shape[2], v.shape[3]
    scale = K ** -0.5 if scale is None else scale
    S = q.new_zeros(B, H, K, V, dtype=torch.float32) if initial_state is None else initial_state.float()
    outputs = []
    for t in range(T):
        o_t, S = gated_delta_rule_step(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], S, scale)
        outputs.append(o_t)
    o = torch.stack(outputs, dim=1).to(v.dtype)
    return o, (S if output_final_state else None)
