"""Chunkwise gated linear attention in PyTorch (GLA paper, section 4.2-4.3): the engine shared by the ops.

One engine serves gla, simple_gla and both passes of gsa. It runs the
recurrence

    S_t = (exp(gk_t) exp(gv_t)^T * exp(g_t)) (.) S_{t-1} + k_t v_t^T,    o_t = scale * S_t^T q_t

where every gate is optional and in log space (<= 0): `g` [B,T,H] is one
decay per head and step (simple GLA / RetNet), `gk` [B,T,H,K] decays the key
rows of the [K, V] state (GLA), `gv` [B,T,H,V] decays its value columns (the
first GSA pass). This is the general form of the paper's appendix C.2 with
B = exp(cumsum gk) and D = exp(cumsum gv).

The sequence is cut into chunks of C steps. With cumulative log gates
b_i = sum_{s<=i} g_s taken inside each chunk:

* inter-chunk (sec. 4.2): S_[n+1] = gamma_n (.) S_[n] + (K (.) Gamma)^T V and
  O_inter = (Q (.) Lambda) S_[n], with Lambda_i = exp(b_i), Gamma_i = exp(b_C - b_i),
  gamma_n = exp(b_C); chunk states come from one sequential scan;
* intra-chunk: the masked attention-like matrix P_ij = sum_k q_ik k_jk exp(b_ik - b_jk),
  j <= i (eq. 4). For per-channel gates it is built by secondary chunking
  (sec. 4.3, Listing 1): blocks between sub-chunks are plain matmuls with every
  decay measured from the end of the previous sub-chunk, and diagonal blocks are
  computed in log space.

Numerics: every exponent that is evaluated is a sum of gates, hence <= 0, so
nothing overflows even for very strong decays; decays from the future are
masked to -inf *before* exp. Exponents are accumulated directly over the
segment they span (segment sums, suffix sums) rather than as differences of
long prefix sums, which keeps the tiny gate gradients of fast-decaying heads
accurate and gives exact-zero exponents no gradient at all.

Two intra-chunk forms, chosen per call (same math, same results to fp32 rounding):

* factored (fast, lean): when every per-channel gate sums to no less than
  -FACTORED_LOG_RANGE over each chunk, exp(b_i - b_j) = exp(b_i) * exp(-b_j)
  with both factors within [exp(-R), exp(R)], so P = (Q (.) Lambda)(K / Lambda)^T
  is one matmul per chunk, as the inter-chunk part (fla's chunk kernels take the
  same reference). Memory and work are O(C K) per chunk;
* log-space (exact for any gate): the secondary chunking above, whose diagonal
  blocks materialise [C, c, K] segment decays. It serves strong decays, where
  exp(-b_j) would overflow.

GQA: q is viewed as [.., H, G, K] and the G query heads of a group share the
kv head's state in every matmul; k/v/gates/state are never repeated.
"""
import math

import torch
import torch.nn.functional as F

__all__ = ["chunk_gated_linear_attention"]

SUB_CHUNK_SIZE = 16
FACTORED_LOG_RANGE = 20.0
"""Largest total per-channel log decay over one chunk for which the factored intra-chunk form is used:
its factors stay within exp(+-20) (no overflow or underflow in fp32) and the exponents' rounding costs
at most ~1e-6 relative error per term."""


def _to_chunks(x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """[B, T, H, *rest] -> fp32 [B, H, N, C, *rest], zero-padded to N*C steps.

    Zero padding is harmless: a zero log gate leaves the state as it is and a
    zero key adds nothing, so the final state is unchanged.
    """
    B, T, H = x.shape[:3]
    n_chunks = -(-T // chunk_size)
    pad = n_chunks * chunk_size - T
    x = x.float()
    if pad:
        x = F.pad(x, (0, 0) * (x.dim() - 2) + (0, pad))
    return x.reshape(B, n_chunks, chunk_size, H, *x.shape[3:]).movedim(3, 1)


def _from_chunks(x: torch.Tensor, seq_len: int) -> torch.Tensor:
    """[B, H, N, C, G, V] -> [B, T, H*G, V] (inverse of _to_chunks for grouped outputs)."""
    B, H, N, C, G, V = x.shape
    return x.movedim(1, 3).reshape(B, N * C, H * G, V)[:, :seq_len]


def _exp_masked(log_decay: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """exp(log_decay) where `keep`, exactly 0 elsewhere (masking happens before exp)."""
    return log_decay.masked_fill(~keep, float("-inf")).exp()


def _causal(n: int, device, strict: bool = False) -> torch.Tensor:
    """[n, n] bool mask of (i, j) with j <= i (j < i if strict)."""
    return torch.ones(n, n, dtype=torch.bool, device=device).tril(-1 if strict else 0)


def _segment_decay(step_log: torch.Tensor) -> torch.Tensor:
    """exp(sum_{j < s <= i} g_s) for j <= i, else 0: [.., c, D] -> [.., c_i, c_j, D].

    The segment sums are accumulated directly from the gates (not as the
    difference b_i - b_j of two long prefix sums), so they keep full relative
    precision however strong the decay, and the diagonal is an exact constant 0
    that sends no spurious gradient into the gates.
    """
    c = step_log.shape[-2]
    later = _causal(c, step_log.device, strict=True)[:, :, None]              # s > j
    terms = step_log.unsqueeze(-2).expand(*step_log.shape[:-1], c, step_log.shape[-1])
    segment = terms.masked_fill(~later, 0.0).cumsum(-3)                      # [.., i, j, D]
    return _exp_masked(segment, _causal(c, step_log.device)[:, :, None])


def _decay_to_end(step_log: torch.Tensor) -> torch.Tensor:
    """sum_{s > j} g_s within the block (log of Gamma_j): [.., C, D] -> [.., C, D].

    Summed directly from the end, so the last row is an exact constant 0.
    """
    suffix = step_log.flip(-2).cumsum(-2).flip(-2)             # sum_{s >= j}
    return F.pad(suffix[..., 1:, :], (0, 0, 0, 1))


def _sub_chunk_factors(step_log: torch.Tensor, sub: int):
    """Log decays linking sub-chunks through the end of sub-chunk I-1 (sec. 4.3, Listing 1).

    step_log [.., C, D] -> (from_start [.., I, i, D], to_ref [.., I, J, j, D]) with
    from_start = sum of g over (start of I, i] and to_ref = sum of g over (j, start of I)
    for j in sub-chunk J < I (masked to -inf otherwise), so that
    exp(from_start_i + to_ref_j) = exp(b_i - b_j) with both parts <= 0.
    """
    *lead, C, D = step_log.shape
    n = C // sub
    steps = step_log.reshape(*lead, n, sub, D)
    totals = steps.sum(-2)                                                    # [.., L, D]
    idx = torch.arange(n, device=step_log.device)
    between = (idx[None, :, None] < idx[None, None, :]) & (idx[None, None, :] < idx[:, None, None])
    gap = torch.einsum("IJL,...LD->...IJD", between.to(step_log.dtype), totals)   # J < L < I
    to_ref = _decay_to_end(steps).unsqueeze(-4) + gap.unsqueeze(-2)           # [.., I, J, j, D]
    earlier = _causal(n, step_log.device, strict=True)[:, :, None, None]
    return steps.cumsum(-2), to_ref.masked_fill(~earlier, float("-inf"))


def _key_gated_scores(q: torch.Tensor, k: torch.Tensor, gk: torch.Tensor, sub: int) -> torch.Tensor:
    """P_ij = sum_k q_ik k_jk exp(b_ik - b_jk) for j <= i, else 0 (eq. 4 via sec. 4.3).

    q [.., C, G, K], k / gk [.., C, K] (gk: per-step key log gates). Blocks between
    sub-chunks are matmuls; diagonal blocks use the log-space segment decays.
    Returns [.., C, G, C].
    """
    *lead, C, G, K = q.shape
    n = C // sub
    qs, ks = q.reshape(*lead, n, sub, G, K), k.reshape(*lead, n, sub, K)
    from_start, to_ref = _sub_chunk_factors(gk, sub)
    q_ref = qs * from_start.exp().unsqueeze(-2)                # [.., I, i, G, K]
    k_ref = ks.unsqueeze(-4) * to_ref.exp()                    # [.., I, J, j, K], zero unless J < I
    scores = torch.einsum("...Iigk,...IJjk->...IigJj", q_ref, k_ref)
    decay = _segment_decay(gk.reshape(*lead, n, sub, K))       # [.., I, i, j, K]
    diag = torch.einsum("...Iigk,...Iijk->...Iigj", qs, ks.unsqueeze(-3) * decay)
    on_diag = torch.eye(n, device=q.device, dtype=q.dtype)[:, None, None, :, None]
    scores = scores + diag.unsqueeze(-2) * on_diag
    return scores.reshape(*lead, C, G, C)


def _value_gated_mix(scores: torch.Tensor, v: torch.Tensor, gv: torch.Tensor, sub: int) -> torch.Tensor:
    """o_iv = sum_{j<=i} P_ij v_jv exp(b_iv - b_jv): causal mixing under a value-side decay.

    scores [.., C, G, C] (already causal), v / gv [.., C, V]. Same sub-chunk
    scheme as `_key_gated_scores`, mirrored onto the value channels.
    Returns [.., C, G, V].
    """
    *lead, C, G, _ = scores.shape
    V = v.shape[-1]
    n = C // sub
    ps = scores.reshape(*lead, n, sub, G, n, sub)
    vs = v.reshape(*lead, n, sub, V)
    from_start, to_ref = _sub_chunk_factors(gv, sub)
    v_ref = vs.unsqueeze(-4) * to_ref.exp()                    # [.., I, J, j, V]
    out = torch.einsum("...IigJj,...IJjv->...Iigv", ps, v_ref) * from_start.exp().unsqueeze(-2)
    diag_scores = torch.diagonal(ps, dim1=-5, dim2=-2).movedim(-1, -4)   # [.., I, i, G, j]
    decay = _segment_decay(gv.reshape(*lead, n, sub, V))
    out = out + torch.einsum("...Iigj,...Iijv->...Iigv", diag_scores, vs.unsqueeze(-3) * decay)
    return out.reshape(*lead, C, G, V)


def _intra_chunk(q, k, v, g, gk, gv, sub: int, same=None) -> torch.Tensor:
    """Output of each chunk from its own keys/values only: [B, H, N, C, G, V].

    g [.., C, 1], gk [.., C, K], gv [.., C, V]: per-step log gates or None; same [.., C, 1, C]: which
    pairs (i, j) lie in one packed sequence, or None.
    """
    C = k.shape[-2]
    if gk is None:
        scores = torch.einsum("...igk,...jk->...igj", q, k)
    else:
        scores = _key_gated_scores(q, k, gk, sub)
    if g is not None:   # scalar decay: one [C, C] factor (RetNet-style), no sub-chunks needed
        scores = scores * _segment_decay(g).squeeze(-1).unsqueeze(-2)
    elif gk is None:
        scores = scores.masked_fill(~_causal(C, q.device).unsqueeze(-2), 0.0)
    if same is not None:
        scores = scores * same
    if gv is None:
        return torch.einsum("...igj,...jv->...igv", scores, v)
    return _value_gated_mix(scores, v, gv, sub)


def _intra_chunk_factored(q, q_from_start, k, v, g, key_prefix, value_prefix, same=None) -> torch.Tensor:
    """`_intra_chunk` for gates whose chunk totals are >= -FACTORED_LOG_RANGE: [B, H, N, C, G, V].

    q_from_start = Q (.) exp(b^k) (already formed for the inter-chunk part); key_prefix / value_prefix
    are the in-chunk prefix sums b^k [.., C, K] / b^v [.., C, V] or None; g [.., C, 1] a scalar decay
    or None. For j < i, P_ij = sum_k (q_ik e^{b_ik}) (k_jk e^{-b_jk}), and with a value-side decay
    o_iv = e^{b_iv} sum_{j<i} P_ij (v_jv e^{-b_jv}); `same` masks pairs across packed sequences. The diagonal
    (decay exactly 1) is added apart, as q_i . k_i times v_i, so it carries no rounding of the factors and sends
    no gradient to the gates.
    """
    C = k.shape[-2]
    k_ref = k if key_prefix is None else k * (-key_prefix).exp()
    scores = torch.einsum("...igk,...jk->...igj", q_from_start, k_ref)
    if g is not None:
        scores = scores * _segment_decay(g).squeeze(-1).unsqueeze(-2)
    scores = scores.masked_fill(~_causal(C, k.device, strict=True).unsqueeze(-2), 0.0)
    if same is not None:
        scores = scores * same
    diag = torch.einsum("...igk,...ik->...ig", q, k).unsqueeze(-1) * v.unsqueeze(-2)      # [.., C, G, V]
    if value_prefix is None:
        return torch.einsum("...igj,...jv->...igv", scores, v) + diag
    out = torch.einsum("...igj,...jv->...igv", scores, v * (-value_prefix).exp())
    return out * value_prefix.exp().unsqueeze(-2) + diag


def _factored_fits(*prefixes: torch.Tensor | None) -> bool:
    """True when every chunk's total per-channel log decay is >= -FACTORED_LOG_RANGE."""
    for prefix in prefixes:
        if prefix is not None and prefix.numel() and bool(prefix[..., -1, :].min() < -FACTORED_LOG_RANGE):
            return False
    return True


def _scan_chunk_states(k, v, key_step, value_step, initial_state, segments=None):
    """Sequential inter-chunk recurrence (sec. 4.2); returns (state before each chunk, last state).

    key_step [.., C, K or 1] (gk and scalar g merged) and value_step [.., C, V]
    are the per-step log gates of each chunk, or None. With `segments` (`_segment_masks`), a chunk
    that holds the start of a packed sequence drops the carried state and writes only the keys of
    its last sequence.
    """
    B, H, N = k.shape[:3]
    K, V = k.shape[-1], v.shape[-1]
    log_decay = k.new_zeros(B, H, N, 1, 1)                     # log gamma_n = b_C
    if key_step is not None:
        k = k * _decay_to_end(key_step).exp()                   # K (.) Gamma
        log_decay = log_decay + key_step.sum(-2).unsqueeze(-1)
    if value_step is not None:
        v = v * _decay_to_end(value_step).exp()
        log_decay = log_decay + value_step.sum(-2).unsqueeze(-2)
    if segments is not None:
        k = k * segments.in_last.unsqueeze(-1)
    updates = torch.einsum("...ck,...cv->...kv", k, v)          # [B, H, N, K, V]
    decay = log_decay.exp()
    if segments is not None:
        decay = decay * segments.carry.unsqueeze(-1).unsqueeze(-1)
    state = k.new_zeros(B, H, K, V) if initial_state is None else initial_state.float()
    starts = []
    for n in range(N):
        starts.append(state)
        state = decay[:, :, n] * state + updates[:, :, n]
    return torch.stack(starts, dim=2), state


class _SegmentMasks:
    """Where packed sequences meet, per chunk (segment ids of one flattened row, [B, T]):

    * `same` [B, 1, N, C, 1, C]: i and j lie in one sequence (intra-chunk pairs kept);
    * `reads_carry` [B, 1, N, C, 1, 1]: position i continues the sequence the carried state belongs to;
    * `in_last` [B, 1, N, C]: key j belongs to the chunk's last sequence (written into the next state);
    * `carry` [B, 1, N]: the chunk holds no sequence start, so the carried state decays on (else reset).

    Decays need no masking: every pair kept spans gates of a single sequence.
    """

    def __init__(self, segments: torch.Tensor, chunk_size: int):
        B, T = segments.shape
        pad = -T % chunk_size
        seg = F.pad(segments, (0, pad), value=int(segments[0, -1])) if pad else segments   # padding: inert
        seg = seg.reshape(B, 1, -1, chunk_size)                                             # [B, 1, N, C]
        last = seg[..., -1]
        before = torch.cat([seg[..., :1, 0], last[..., :-1]], dim=-1)   # the carried state's sequence
        self.same = (seg.unsqueeze(-1) == seg.unsqueeze(-2)).unsqueeze(-2)
        self.reads_carry = (seg == before.unsqueeze(-1))[..., None, None]
        self.in_last = (seg == last.unsqueeze(-1)).float()
        self.carry = (before == last).float()


def chunk_gated_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    g: torch.Tensor | None = None,
    gk: torch.Tensor | None = None,
    gv: torch.Tensor | None = None,
    scale: float,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
    segments: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Engine for one batch of equal-length rows (no checks).

    q [B,T,HQ,K], k [B,T,H,K], v [B,T,H,V]; g [B,T,H], gk [B,T,H,K], gv [B,T,H,V]
    log gates, each optional; initial_state [B,H,K,V]. `segments` [B, T] (non-decreasing ids) packs
    several sequences into each row: nothing crosses from one id to the next, and the final state is
    the last sequence's (`t2r.ops.utils.segment_ids` makes them from cu_seqlens). Returns the output in
    fp32 [B,T,HQ,V] (callers cast) and the fp32 final state or None.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size}")
    B, T, HQ, K = q.shape
    H = k.shape[2]
    sub = math.gcd(chunk_size, SUB_CHUNK_SIZE)
    qc = _to_chunks(q.reshape(B, T, H, HQ // H, K), chunk_size) * scale   # [B,H,N,C,G,K]
    kc, vc = _to_chunks(k, chunk_size), _to_chunks(v, chunk_size)
    g_step = _to_chunks(g, chunk_size).unsqueeze(-1) if g is not None else None   # [B,H,N,C,1]
    gk_step = _to_chunks(gk, chunk_size) if gk is not None else None            # [B,H,N,C,K]
    gv_step = _to_chunks(gv, chunk_size) if gv is not None else None            # [B,H,N,C,V]
    # Scalar and key-channel decays act the same way between chunks: merge them.
    key_step = gk_step if g_step is None else (g_step if gk_step is None else gk_step + g_step)
    masks = None if segments is None else _SegmentMasks(segments, chunk_size)
    starts, final = _scan_chunk_states(kc, vc, key_step, gv_step, initial_state, masks)

    # Inter-chunk output (Q (.) Lambda) S_[n], Lambda_i = exp(b_i), b_i = sum_{s <= i} g_s.
    key_prefix = key_step.cumsum(-2) if key_step is not None else None
    value_prefix = gv_step.cumsum(-2) if gv_step is not None else None
    q_from_start = qc if key_prefix is None else qc * key_prefix.exp().unsqueeze(-2)
    o_inter = torch.einsum("...cgk,...kv->...cgv", q_from_start, starts)
    if value_prefix is not None:
        o_inter = o_inter * value_prefix.exp().unsqueeze(-2)
    if masks is not None:
        o_inter = o_inter * masks.reads_carry
    same = None if masks is None else masks.same
    gk_prefix = None if gk_step is None else (key_prefix if g_step is None else gk_step.cumsum(-2))
    if _factored_fits(gk_prefix, value_prefix):
        q_gk = qc if gk_prefix is None else (q_from_start if g_step is None else qc * gk_prefix.exp().unsqueeze(-2))
        o_intra = _intra_chunk_factored(qc, q_gk, kc, vc, g_step, gk_prefix, value_prefix, same)
    else:
        o_intra = _intra_chunk(qc, kc, vc, g_step, gk_step, gv_step, sub, same)
    return _from_chunks(o_inter + o_intra, T), (final if output_final_state else None)
