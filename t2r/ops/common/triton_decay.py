"""Shared Triton pieces of the GLA and simple-GLA kernels (see triton_chunk.py for the
algorithm): the scalar-gate load and the anchored intra-chunk score matrix."""
import triton
import triton.language as tl

from ..triton_utils import RCP_LN2, fits_one_anchor

_LOG2E = tl.constexpr(RCP_LN2)
_CLAMP = tl.constexpr(120.0)


@triton.jit
def _scalar_gate(g, bos, i_h, i_t, T, H: tl.constexpr, BT: tl.constexpr):
    """The [BT] scalar log gates of chunk i_t, in log2 units (plain masked load, no block ptr)."""
    o_t = i_t * BT + tl.arange(0, BT)
    return tl.load(g + (bos + o_t) * H + i_h, mask=o_t < T, other=0.).to(tl.float32) * _LOG2E


@triton.jit
def _anchored(b, BT: tl.constexpr):
    """(2^(b - b_a), 2^(b_a - b)) with a = BT // 2, for the single-anchor path."""
    b_ba = tl.sum(tl.where((tl.arange(0, BT) == BT // 2)[:, None], b, 0.), axis=0)
    return tl.exp2(tl.minimum(b - b_ba[None, :], _CLAMP)), tl.exp2(tl.minimum(b_ba[None, :] - b, _CLAMP))


@triton.jit
def _gated_scores(acc, b_qs, b_k, b_b, BT: tl.constexpr, BS: tl.constexpr, TRANSPOSED: tl.constexpr):
    """acc + this K-block's share of A_ij = sum_k q_ik k_jk 2^(b_ik - b_jk) ([i, j]; [j, i] when
    TRANSPOSED, as its own product: see the tl.trans note in triton_chunk.py), for every i and the keys
    j <= i (entries above the diagonal are left for the caller to mask). One anchored product
    when the chunk's gates allow it, else one per BS-row sub-block."""
    dt = b_k.dtype
    if fits_one_anchor(b_b):
        e_q, e_k = _anchored(b_b, BT)
        b_qa, b_ka = (b_qs * e_q).to(dt), (b_k * e_k).to(dt)
        if TRANSPOSED:
            acc += tl.dot(b_ka, tl.trans(b_qa))
        else:
            acc += tl.dot(b_qa, tl.trans(b_ka))
    else:
        o_i = tl.arange(0, BT)
        for s in tl.static_range(BT // BS):
            b_ba = tl.sum(tl.where((o_i == s * BS + BS // 2)[:, None], b_b, 0.), axis=0)
            m_q = (o_i >= s * BS) & (o_i < s * BS + BS)
            m_k = o_i < s * BS + BS
            b_qa = tl.where(m_q[:, None], b_qs * tl.exp2(tl.minimum(b_b - b_ba[None, :], _CLAMP)), 0.).to(dt)
            b_ka = tl.where(m_k[:, None], b_k * tl.exp2(tl.minimum(b_ba[None, :] - b_b, _CLAMP)), 0.).to(dt)
            if TRANSPOSED:
                acc += tl.dot(b_ka, tl.trans(b_qa))
            else:
                acc += tl.dot(b_qa, tl.trans(b_ka))
    return acc
