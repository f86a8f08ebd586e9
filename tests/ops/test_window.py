"""Sliding-window + sink attention: the chunked form equals the written-out rule, and the rule is right."""

import pytest
import torch

from t2r.ops.window import chunk_window_attention, naive_window_attention, visible_keys, window_attention


def packed_and_padded(batch: int, length: int):
    """positions and real flags: row 0 packs three documents, row 1 (if any) is left padded by 5."""
    positions = torch.arange(length).expand(batch, length).clone()
    real = torch.ones(batch, length, dtype=torch.bool)
    first, second = length // 3, length // 3 + 4
    positions[0, first:second] -= first
    positions[0, second:] -= second
    if batch > 1:
        real[1, :5] = False
        positions[1] = (real[1].long().cumsum(0) - 1).clamp(min=0)
        positions[1, :5] = 1  # as generate() fills padded positions
    return positions, real


SHAPES = [  # B, T, HQ, H, D, window, sinks, block
    (2, 37, 4, 2, 8, 5, 2, 4),
    (1, 100, 6, 3, 16, 16, 4, 8),
    (2, 19, 2, 2, 8, 64, 4, 64),   # window past the length: full causal softmax
    (1, 50, 4, 1, 8, 7, 0, 16),    # no sinks
    (2, 65, 4, 2, 32, 1, 1, 64),   # window of one: each token reads itself and the first
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_equals_the_rule_forward_and_backward(shape, dtype, assert_close):
    batch, length, heads_q, heads, dim, window, sinks, block = shape
    positions, real = packed_and_padded(batch, length)
    inputs = [torch.randn(batch, length, h, dim, dtype=dtype, requires_grad=True) for h in (heads_q, heads, heads)]
    kwargs = dict(positions=positions, real=real, window=window, sinks=sinks, scale=dim ** -0.5)
    cotangent = torch.randn(batch, length, heads_q, dim)
    results = []
    for fn in (naive_window_attention, lambda *a, **k: chunk_window_attention(*a, block=block, **k)):
        out = fn(*inputs, **kwargs)
        grads = torch.autograd.grad((out.float() * cotangent).sum(), inputs)
        results.append({"o": out.float(), **{f"d{n}": g.float() for n, g in zip("qkv", grads)}})
    naive, chunked = results
    assert_close(chunked, naive, rtol=1e-5 if dtype == torch.float32 else 2e-2)


def test_rule_matches_a_loop_over_queries():
    """The visibility rule against its plain-words definition, query by query."""
    positions, real = packed_and_padded(2, 30)
    index = torch.arange(30).expand(2, 30)
    visible = visible_keys(index, positions, index, positions, real, window=4, sinks=2)
    for b in range(2):
        for i in range(30):
            for j in range(30):
                document_start = i - positions[b, i].item()
                same = real[b, i] and real[b, j] and document_start <= j <= i
                expected = i == j or (same and (j - document_start < 2 or i - j < 4))
                assert visible[b, i, j].item() == expected, (b, i, j)


def test_short_sequences_get_plain_causal_softmax():
    """Length <= window + sinks: every earlier token is visible, so the result is causal SDPA."""
    q, k, v = torch.randn(2, 12, 4, 8), torch.randn(2, 12, 2, 8), torch.randn(2, 12, 2, 8)
    out = window_attention(q, k, v, positions=torch.arange(12)[None], window=9, sinks=3, scale=0.2)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, scale=0.2, enable_gqa=True)
    torch.testing.assert_close(out, expected.transpose(1, 2), rtol=1e-5, atol=1e-5)


def test_bad_arguments_are_named():
    q = torch.randn(1, 4, 3, 8)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        window_attention(q, torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8), positions=torch.arange(4)[None],
                         window=2, sinks=0, scale=1.0)
    with pytest.raises(ValueError, match="window must be >= 1"):
        window_attention(q, q, q, positions=torch.arange(4)[None], window=0, sinks=0, scale=1.0)


@pytest.mark.parametrize("shape", SHAPES[:2])
def test_flex_attention_form_equals_the_rule(shape, assert_close):
    """FlexAttention with the rule as its mask_mod (eager here; compiled on CUDA, where the test below runs)."""
    from t2r.ops.window import flex_window_attention

    batch, length, heads_q, heads, dim, window, sinks, _ = shape
    positions, real = packed_and_padded(batch, length)
    q, k, v = (torch.randn(batch, length, h, dim) for h in (heads_q, heads, heads))
    kwargs = dict(positions=positions, real=real, window=window, sinks=sinks, scale=dim ** -0.5)
    assert_close(flex_window_attention(q, k, v, **kwargs), naive_window_attention(q, k, v, **kwargs), rtol=1e-5)


@pytest.mark.parametrize("length, window, sinks", [(700, 48, 4), (517, 200, 0), (300, 1, 3)])
def test_flex_block_mask_over_many_blocks(length, window, sinks, assert_close):
    """Past one 128-token block: the block mask built from block distances keeps every block the rule needs
    (documents starting mid-row put sinks in later blocks; left padding), and the outputs equal the rule's."""
    from t2r.ops.window import flex_window_attention
    from t2r.ops.window.flex import BLOCK, _reachable_blocks

    positions, real = packed_and_padded(2, length)
    index = torch.arange(length).expand(2, length)
    visible = visible_keys(index, positions, index, positions, real, window=window, sinks=sinks)
    reach = _reachable_blocks(positions, window, sinks, length)[:, 0]
    blocks = visible.nonzero()
    assert reach[blocks[:, 0], blocks[:, 1] // BLOCK, blocks[:, 2] // BLOCK].all()
    assert not reach.all()                                          # and skips some
    q, k, v = (torch.randn(2, length, h, 16) for h in (4, 2, 2))
    kwargs = dict(positions=positions, real=real, window=window, sinks=sinks, scale=0.25)
    assert_close(flex_window_attention(q, k, v, **kwargs), naive_window_attention(q, k, v, **kwargs), rtol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled FlexAttention needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_flex_on_cuda_equals_the_rule_forward_and_backward(dtype, assert_close):
    from t2r.ops.window import flex_window_attention

    batch, length, heads_q, heads, dim, window, sinks = 2, 300, 8, 2, 64, 48, 4
    positions, real = (t.cuda() for t in packed_and_padded(batch, length))
    inputs = [torch.randn(batch, length, h, dim, device="cuda", dtype=dtype, requires_grad=True)
              for h in (heads_q, heads, heads)]
    kwargs = dict(positions=positions, real=real, window=window, sinks=sinks, scale=dim ** -0.5)
    cotangent = torch.randn(batch, length, heads_q, dim, device="cuda")
    results = []
    for fn in (naive_window_attention, flex_window_attention):
        out = fn(*inputs, **kwargs)
        grads = torch.autograd.grad((out.float() * cotangent).sum(), inputs)
        results.append({"o": out.float(), **{f"d{n}": g.float() for n, g in zip("qkv", grads)}})
    assert_close(results[1], results[0], rtol=2e-2 if dtype == torch.bfloat16 else 1e-4)
