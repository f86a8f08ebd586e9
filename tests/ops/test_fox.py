"""Tests for t2r.ops.fox: naive reference, blockwise form, and the dispatcher."""
import pytest
import torch
import torch.nn.functional as F

from t2r.ops.fox import chunk_forgetting_attention, forgetting_attention, naive_forgetting_attention


def make_inputs(B, Tq, Tk, HQ, H, K, V, dtype=torch.float32, seed=0, grad=False):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Tq, HQ, K, generator=gen)
    k = torch.randn(B, Tk, H, K, generator=gen)
    v = torch.randn(B, Tk, H, V, generator=gen)
    g = F.logsigmoid(torch.randn(B, Tk, HQ, generator=gen) + 2.0)   # log forget gates <= 0
    ts = [t.to(dtype).requires_grad_(grad) for t in (q, k, v, g)]
    return ts


def grads(fn, q, k, v, g, **kw):
    """Output and grads of <o, w> for a fixed random cotangent w."""
    o = fn(q, k, v, g, **kw)
    w = torch.randn(o.shape, generator=torch.Generator().manual_seed(1))
    dq, dk, dv, dg = torch.autograd.grad((o.float() * w).sum(), (q, k, v, g))
    return [o, dq, dk, dv, dg]


def assert_close(a, b, rel, name=""):
    """Max abs error relative to the max magnitude of the reference."""
    err = (a.float() - b.float()).abs().max().item()
    ref = b.float().abs().max().item()
    assert err <= rel * max(ref, 1e-6), f"{name}: max err {err:.3e} vs ref scale {ref:.3e}"


def loop_reference(q, k, v, g, scale):
    """Scalar loops straight from Eq. 11 (B=1, HQ=H): an independent check of the naive form."""
    _, Tq, HQ, _ = q.shape
    Tk = k.shape[1]
    o = torch.zeros(1, Tq, HQ, v.shape[-1], dtype=torch.float64)
    for h in range(HQ):
        for i in range(Tq):
            p = Tk - Tq + i
            logits = []
            for j in range(p + 1):
                d = sum(g[0, l, h].item() for l in range(j + 1, p + 1))   # D_ij
                logits.append(scale * (q[0, i, h] @ k[0, j, h]).item() + d)
            w = torch.softmax(torch.tensor(logits, dtype=torch.float64), 0)
            o[0, i, h] = (w[:, None] * v[0, : p + 1, h].double()).sum(0)
    return o


SHAPES = [  # B, Tq, Tk, HQ, H, K, V
    (2, 37, 37, 4, 4, 16, 8),     # training, odd length, several blocks
    (1, 64, 64, 2, 2, 8, 16),     # exact multiple of the block
    (2, 13, 50, 6, 2, 16, 16),    # prefix cache + GQA, Tq < Tk
    (3, 1, 29, 4, 1, 8, 8),       # single-token decode, MQA
]


@pytest.mark.parametrize("Tq,Tk", [(5, 5), (3, 7)])
def test_naive_matches_scalar_loops(Tq, Tk):
    q, k, v, g = make_inputs(1, Tq, Tk, 2, 2, 4, 3, seed=3)
    g = g * 3  # strong forgetting so the bias matters
    o = naive_forgetting_attention(q, k, v, g, scale=0.7)
    assert_close(o, loop_reference(q, k, v, g, 0.7), 1e-5)


@pytest.mark.parametrize("shape", SHAPES)
def test_chunk_matches_naive_fp32(shape):
    ins = make_inputs(*shape, grad=True)
    ref = grads(naive_forgetting_attention, *ins)
    out = grads(lambda *a: chunk_forgetting_attention(*a, block_size=16), *ins)
    for a, b, name in zip(out, ref, ["o", "dq", "dk", "dv", "dg"]):
        assert_close(a, b, 1e-5, name)


@pytest.mark.parametrize("shape", SHAPES[:3])
def test_dispatcher_bf16_vs_fp32_reference(shape):
    ins = make_inputs(*shape, grad=True)
    ref = grads(naive_forgetting_attention, *ins)
    ins16 = [t.detach().bfloat16().requires_grad_() for t in ins]
    out = grads(forgetting_attention, *ins16)
    assert out[0].dtype == torch.bfloat16
    assert all(t.dtype == torch.bfloat16 for t in out[1:])
    for a, b, name in zip(out, ref, ["o", "dq", "dk", "dv", "dg"]):
        assert_close(a, b, 2e-2, name)


@pytest.mark.parametrize("fn", [naive_forgetting_attention, forgetting_attention])
def test_gqa_equals_repeated_kv(fn):
    B, Tq, Tk, HQ, H = 2, 9, 21, 6, 2
    q, k, v, g = make_inputs(B, Tq, Tk, HQ, H, 8, 8, grad=True)
    o, dq, dk, dv, dg = grads(fn, q, k, v, g)
    kr = k.detach().repeat_interleave(HQ // H, 2).requires_grad_()
    vr = v.detach().repeat_interleave(HQ // H, 2).requires_grad_()
    ro, rdq, rdk, rdv, rdg = grads(naive_forgetting_attention, q, kr, vr, g)
    assert_close(o, ro, 1e-5, "o")
    assert_close(dq, rdq, 1e-5, "dq")
    assert_close(dg, rdg, 1e-5, "dg")
    assert_close(dk, rdk.view(B, Tk, H, HQ // H, -1).sum(3), 1e-5, "dk")
    assert_close(dv, rdv.view(B, Tk, H, HQ // H, -1).sum(3), 1e-5, "dv")


@pytest.mark.parametrize("Tq,Tk", [(33, 33), (7, 20)])
@pytest.mark.parametrize("fn", [naive_forgetting_attention, forgetting_attention])
def test_zero_gate_is_causal_sdpa(fn, Tq, Tk):
    q, k, v, g = make_inputs(2, Tq, Tk, 4, 4, 16, 16)
    o = fn(q, k, v, torch.zeros_like(g))
    causal = torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq)   # bottom-right aligned
    ref = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=causal
    ).transpose(1, 2)
    assert_close(o, ref, 1e-5)


def test_gate_actually_forgets():
    """A very negative gate makes each query attend only to its own key."""
    q, k, v, g = make_inputs(1, 12, 12, 2, 2, 8, 8)
    o = forgetting_attention(q, k, v, torch.full_like(g, -60.0))
    assert_close(o, v, 1e-5)


def test_scale_argument():
    q, k, v, g = make_inputs(1, 10, 10, 2, 2, 8, 8)
    o = forgetting_attention(q, k, v, g, scale=0.3)
    assert_close(o, naive_forgetting_attention(q, k, v, g, scale=0.3), 1e-5)
    assert_close(forgetting_attention(q * 0.3 / 8 ** -0.5, k, v, g), o, 1e-5)


def test_decode_matches_full_rows():
    B, T, HQ, H = 2, 19, 4, 2
    q, k, v, g = make_inputs(B, T, T, HQ, H, 8, 8)
    full = forgetting_attention(q, k, v, g)
    for t in range(T):
        step = forgetting_attention(q[:, t:t + 1], k[:, :t + 1], v[:, :t + 1], g[:, :t + 1])
        assert_close(step[:, 0], full[:, t], 1e-5, f"t={t}")


def test_left_padding_matches_unpadded_runs():
    lengths, Tk, HQ, H = [17, 9, 1], 17, 4, 2
    q, k, v, g = make_inputs(len(lengths), Tk, Tk, HQ, H, 8, 8, grad=True)
    mask = torch.zeros(len(lengths), Tk, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, Tk - n:] = 1
    o = forgetting_attention(q, k, v, g, attention_mask=mask)
    o.sum().backward()
    for b, n in enumerate(lengths):
        sl = slice(Tk - n, Tk)
        ref = naive_forgetting_attention(q[b:b + 1, sl], k[b:b + 1, sl], v[b:b + 1, sl], g[b:b + 1, sl])
        assert_close(o[b:b + 1, sl], ref, 1e-5, f"seq {b}")
    # padded query rows see no key: zeros, and nothing flows back as NaN
    assert torch.equal(o[2, :Tk - 1], torch.zeros_like(o[2, :Tk - 1]))
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v, g))
    # padded keys get no gradient
    assert torch.equal(k.grad[1, :Tk - 9], torch.zeros_like(k.grad[1, :Tk - 9]))


def test_padding_mask_chunk_matches_naive_with_grads():
    q, k, v, g = make_inputs(2, 11, 30, 4, 2, 8, 8, grad=True)
    mask = (torch.rand(2, 30, generator=torch.Generator().manual_seed(5)) > 0.4).long()
    mask[0, :] = 0  # a batch row with nothing to see
    ref = grads(naive_forgetting_attention, q, k, v, g, attention_mask=mask)
    out = grads(lambda *a, **kw: chunk_forgetting_attention(*a, block_size=4, **kw),
                q, k, v, g, attention_mask=mask)
    assert not ref[0].isnan().any()
    for a, b, name in zip(out, ref, ["o", "dq", "dk", "dv", "dg"]):
        assert_close(a, b, 1e-5, name)


@pytest.mark.parametrize("fn", [naive_forgetting_attention, forgetting_attention])
def test_cu_seqlens_equals_separate_runs(fn):
    lens, HQ, H = [5, 40, 1, 20], 4, 2
    T = sum(lens)
    q, k, v, g = make_inputs(1, T, T, HQ, H, 8, 8, grad=True)
    cu = torch.tensor([0] + lens).cumsum(0)
    o, *dts = grads(fn, q, k, v, g, cu_seqlens=cu)
    refs = []
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        refs.append(naive_forgetting_attention(q[:, s:e], k[:, s:e], v[:, s:e], g[:, s:e]))
    ref = torch.cat(refs, 1)
    assert_close(o, ref, 1e-5)
    w = torch.randn(o.shape, generator=torch.Generator().manual_seed(1))
    rdts = torch.autograd.grad((ref * w).sum(), (q, k, v, g))
    for a, b, name in zip(dts, rdts, ["dq", "dk", "dv", "dg"]):
        assert_close(a, b, 1e-5, name)


def test_chunk_long_packed_gate_stays_accurate():
    """Packed docs after a long strongly-forgetting prefix: per-document restart keeps fp32 exact."""
    lens = [3000, 7]
    T = sum(lens)
    q, k, v, g = make_inputs(1, T, T, 1, 1, 4, 4)
    g = torch.full_like(g, -3.0)
    g[0, 3000:] = -1e-3  # weak forgetting inside the last doc: its D_ij are tiny
    cu = torch.tensor([0, 3000, T])
    o = chunk_forgetting_attention(q, k, v, g, cu_seqlens=cu, block_size=512)[:, 3000:]
    ref = naive_forgetting_attention(q[:, 3000:], k[:, 3000:], v[:, 3000:], g[:, 3000:])
    assert_close(o, ref, 1e-5)


def test_no_grad_path_and_dtype():
    q, k, v, g = make_inputs(1, 20, 20, 2, 2, 8, 4)
    with torch.no_grad():
        o = forgetting_attention(q, k, v, g)
    assert o.shape == (1, 20, 2, 4) and o.dtype == torch.float32
    assert_close(o, naive_forgetting_attention(q, k, v, g), 1e-5)


@pytest.mark.parametrize("change,match", [
    (dict(q=(1, 8, 3, 8)), "multiple of kv heads"),
    (dict(g=(1, 8, 2)), "g must be"),
    (dict(q=(1, 9, 4, 8)), "more queries"),
    (dict(q=(1, 8, 4, 16)), "head dims"),
    (dict(v=(1, 7, 2, 8)), "share"),
    (dict(mask=(1, 7)), "attention_mask"),
])
def test_bad_shapes_raise(change, match):
    shapes = dict(q=(1, 8, 4, 8), k=(1, 8, 2, 8), v=(1, 8, 2, 8), g=(1, 8, 4), mask=None)
    shapes.update(change)
    q, k, v, g = (torch.randn(shapes[n]) for n in "qkvg")
    mask = None if shapes["mask"] is None else torch.ones(shapes["mask"])
    with pytest.raises(ValueError, match=match):
        forgetting_attention(q, k, v, g, attention_mask=mask)


def test_bad_cu_seqlens_raise():
    q, k, v, g = make_inputs(2, 8, 8, 2, 2, 4, 4)
    with pytest.raises(ValueError, match="batch size 1"):
        forgetting_attention(q, k, v, g, cu_seqlens=torch.tensor([0, 8]))
    q, k, v, g = make_inputs(1, 4, 8, 2, 2, 4, 4)
    with pytest.raises(ValueError, match="Tq == Tk"):
        forgetting_attention(q, k, v, g, cu_seqlens=torch.tensor([0, 8]))
    q, k, v, g = make_inputs(1, 8, 8, 2, 2, 4, 4)
    with pytest.raises(ValueError, match="end at"):
        forgetting_attention(q, k, v, g, cu_seqlens=torch.tensor([0, 3, 6]))
