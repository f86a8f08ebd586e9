"""Chunkwise gated delta rule in PyTorch: the WY representation of DeltaNet's parallel algorithm
(Yang et al. 2024, arXiv 2406.06484, sec. 3.2-3.3) with Gated DeltaNet's decay (arXiv 2412.06464, sec. 3.3).

With S [K, V] the state entering a chunk of C steps, b_i = sum_{s <= i} g_s the gate cumsum inside the
chunk, gamma_i = exp(b_i) and E_ij = exp(b_i - b_j) (j <= i), the new values

    u_t = beta_t (v_t - exp(g_t) S_{t-1}^T k_t)          (so that S_t = exp(g_t) S_{t-1} + k_t u_t^T)

solve a unit lower-triangular system, (I + A) U = diag(beta) (V - diag(gamma) K S) with
A_ij = beta_i (k_i . k_j) E_ij for j < i. With the UT transform T = (I + A)^-1 diag(beta):

    W = T diag(gamma) K,     U' = T V,     U = U' - W S
    O = scale * [ diag(gamma) Q S + (Q K^T (.) E, j <= i) U ]
    S_next = gamma_C S + (K (.) exp(b_C - b))^T U

W and U' depend on the chunk alone (one triangular solve per chunk, no inverse is formed); only the
last two lines run sequentially over chunks. Every exponent is a sum of gates, hence <= 0: masked
before exp, nothing overflows; exponents that span a segment are summed over it (`_segment_decays`).
Padding with zeros is inert (beta = 0 writes nothing, g = 0 keeps S).
Differentiable by autograd; float64 inputs compute in float64 (for gradcheck), others in fp32.
"""

import torch
import torch.nn.functional as F

from ..utils import (
    check_cu_seqlens,
    check_gate,
    check_qkv,
    check_state,
    default_scale,
    map_over_sequences,
    recompute_in_backward,
)

__all__ = ["chunk_gated_delta_rule", "check_gated_delta_inputs"]


def _chunks(x: torch.Tensor, C: int, dtype: torch.dtype) -> torch.Tensor:
    """[B, T, H, *rest] -> [B, H, N, C, *rest] in `dtype`, zero-padded to N*C steps."""
    B, T, H = x.shape[:3]
    pad = -T % C
    x = x.to(dtype)
    if pad:
        x = F.pad(x, (0, 0) * (x.dim() - 2) + (0, pad))
    return x.reshape(B, (T + pad) // C, C, H, *x.shape[3:]).movedim(3, 1)


def _segment_decays(gates: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """exp(b_i - b_j) for j <= i (and for j < i), else 0: [.., C] -> two [.., C, C].

    The exponent is summed directly over the segment j < s <= i rather than taken as the difference of two
    prefix sums: the diagonal is then an exact constant 0 that sends no gradient to the gates, so the small
    gate gradients of fast-decaying heads are not the difference of large cancelling terms."""
    C = gates.shape[-1]
    later = torch.ones(C, C, dtype=torch.bool, device=gates.device).tril(-1)           # [s, j]: s > j
    segment = gates[..., :, None].expand(*gates.shape, C).masked_fill(~later, 0.0).cumsum(-2)
    causal = later | torch.eye(C, dtype=torch.bool, device=gates.device)
    incl = segment.masked_fill(~causal, float("-inf")).exp()
    return incl, incl.masked_fill(~later, 0.0)


def gated_delta_chunks(q, k, v, g, beta, *, scale: float, initial_state: torch.Tensor | None = None,
                       output_final_state: bool = False, chunk_size: int = 64):
    """The chunkwise recurrence for one batch of equal-length rows (no checks); q [B,T,HQ,K], k [B,T,H,K],
    v [B,T,H,V], g / beta [B,T,H], initial_state [B,H,K,V]. Returns (o [B,T,HQ,V] in the compute dtype,
    final state or None)."""
    B, T, HQ, K = q.shape
    H, V = v.shape[2], v.shape[3]
    C = chunk_size
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    qc = _chunks(q.reshape(B, T, H, HQ // H, K), C, dtype) * scale        # [B,H,N,C,G,K]
    kc, vc = _chunks(k, C, dtype), _chunks(v, C, dtype)                    # [B,H,N,C,K], [B,H,N,C,V]
    gc = _chunks(g, C, dtype)                                              # [B,H,N,C]
    b = gc.cumsum(-1)
    bc = _chunks(beta, C, dtype)
    e_incl, e_strict = _segment_decays(gc)                                 # E_ij, j <= i and j < i

    a = bc[..., :, None] * (kc @ kc.transpose(-1, -2)) * e_strict          # strictly lower
    eye = torch.eye(C, dtype=dtype, device=q.device)
    unit_lower = eye + a
    w = torch.linalg.solve_triangular(unit_lower, (bc * b.exp())[..., None] * kc, upper=False, unitriangular=True)
    u_part = torch.linalg.solve_triangular(unit_lower, bc[..., None] * vc, upper=False, unitriangular=True)
    to_end = F.pad(gc.flip(-1).cumsum(-1).flip(-1)[..., 1:], (0, 1))       # b_C - b_j, summed from the end
    k_to_end = kc * to_end.exp()[..., None]
    decay_chunk = b[..., -1].exp()[..., None, None]                        # [B,H,N,1,1]

    state = kc.new_zeros(B, H, K, V) if initial_state is None else initial_state.to(dtype)
    starts, news = [], []
    for n in range(b.shape[2]):
        starts.append(state)
        u = u_part[:, :, n] - w[:, :, n] @ state
        news.append(u)
        state = decay_chunk[:, :, n] * state + k_to_end[:, :, n].transpose(-1, -2) @ u
    starts, news = torch.stack(starts, 2), torch.stack(news, 2)            # [B,H,N,K,V], [B,H,N,C,V]

    o_inter = torch.einsum("...cgk,...kv->...cgv", qc * b.exp()[..., None, None], starts)
    scores = torch.einsum("...cgk,...jk->...cgj", qc, kc) * e_incl.unsqueeze(-2)
    o = o_inter + torch.einsum("...cgj,...jv->...cgv", scores, news)
    o = o.movedim(1, 3).reshape(B, -1, HQ, V)[:, :T]
    return o, (state if output_final_state else None)


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunkwise gated delta rule; same contract as `t2r.ops.gated_delta.gated_delta_rule`."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size}")
    K = check_gated_delta_inputs("chunk_gated_delta_rule", q, k, v, g, beta, initial_state, cu_seqlens)[4]

    def run(q, k, v, g, beta, initial_state, output_final_state):
        return recompute_in_backward(gated_delta_chunks, q, k, v, g, beta, scale=default_scale(scale, K),
                                     initial_state=initial_state, output_final_state=output_final_state,
                                     chunk_size=chunk_size)

    o, final = map_over_sequences(run, (q, k, v, g, beta), initial_state, output_final_state, cu_seqlens)
    return o.to(v.dtype), final


def check_gated_delta_inputs(op: str, q, k, v, g, beta, initial_state, cu_seqlens) -> tuple[int, ...]:
    """Validate gated_delta_rule arguments; return (B, T, HQ, H, K, V)."""
    B, T, HQ, H, K, V = check_qkv(op, q, k, v)
    check_gate(op, "g", g, [B, T, H], "one log decay per kv head and step")
    check_gate(op, "beta", beta, [B, T, H], "one write strength per kv head and step")
    n_seqs = check_cu_seqlens(op, cu_seqlens, B, T)
    check_state(op, "initial_state", initial_state, [n_seqs, H, K, V])
    return B, T, HQ, H, K, V
