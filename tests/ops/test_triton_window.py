"""Triton sliding-window + sink attention against the written-out rule (`naive_window_attention`), fwd and bwd.

On CPU the kernels run in Triton's interpreter at fp32 (every load and store checked against the tensors of
its launch); on a GPU also in bf16 at a model's sizes, and under torch.compile.
"""
import pytest
import torch

from tests.helpers.triton import DEV, INTERPRET, checked_memory, require_triton
from tests.ops.test_window import packed_and_padded

require_triton()

from t2r.ops.window import naive_window_attention, window_attention  # noqa: E402
from t2r.ops.window.triton_window import triton_window_attention  # noqa: E402

SHAPES = [  # B, T, HQ, H, D, window, sinks
    (2, 37, 4, 2, 8, 5, 2),
    (1, 100, 6, 3, 16, 16, 4),
    (2, 19, 2, 2, 8, 64, 4),      # window past the length: full causal softmax
    (1, 50, 4, 1, 8, 7, 0),       # no sinks
    (2, 65, 4, 2, 32, 1, 1),      # window of one: each token reads itself and the first
    (1, 150, 2, 1, 12, 64, 4),    # several query blocks, a head dim that is no power of two
    (1, 200, 3, 3, 16, 100, 2),   # a window longer than a query block
]


def run(fn, inputs, cotangent, **kwargs):
    out = fn(*inputs, **kwargs)
    grads = torch.autograd.grad((out.float() * cotangent).sum(), inputs)
    return {"o": out.float(), **{f"d{n}": g.float() for n, g in zip("qkv", grads)}}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("padded", [True, False])
def test_kernels_equal_the_rule_forward_and_backward(shape, padded, assert_close):
    batch, length, heads_q, heads, dim, window, sinks = shape
    positions, real = (t.to(DEV) for t in packed_and_padded(batch, length))
    inputs = [torch.randn(batch, length, h, dim, device=DEV, requires_grad=True) for h in (heads_q, heads, heads)]
    kwargs = dict(positions=positions, real=real if padded else None, window=window, sinks=sinks,
                  scale=dim ** -0.5)
    cotangent = torch.randn(batch, length, heads_q, dim, device=DEV)
    expected = run(naive_window_attention, inputs, cotangent, **kwargs)
    with checked_memory():
        got = run(triton_window_attention, inputs, cotangent, **kwargs)
    assert_close(got, expected, rtol=1e-5 if INTERPRET else 1e-3)


def test_one_document_per_row_and_many_documents_per_row_agree(assert_close):
    """Documents told apart by positions alone: a row packing two documents gives each what it gives alone."""
    dim, length = 16, 90
    q, k, v = (torch.randn(1, 2 * length, h, dim, device=DEV) for h in (4, 2, 2))
    packed_positions = torch.arange(length, device=DEV).repeat(2)[None]
    kwargs = dict(window=8, sinks=2, scale=0.25)
    packed = triton_window_attention(q, k, v, positions=packed_positions, **kwargs)
    for part in range(2):
        rows = slice(part * length, (part + 1) * length)
        alone = triton_window_attention(q[:, rows], k[:, rows], v[:, rows],
                                        positions=torch.arange(length, device=DEV)[None], **kwargs)
        assert_close(packed[:, rows], alone, rtol=1e-6)


def test_window_attention_picks_the_kernels_when_forced(monkeypatch, assert_close):
    monkeypatch.setenv("T2R_WINDOW_BACKEND", "triton")
    positions, real = (t.to(DEV) for t in packed_and_padded(1, 40))
    q, k, v = (torch.randn(1, 40, h, 8, device=DEV) for h in (2, 1, 1))
    kwargs = dict(positions=positions, real=real, window=6, sinks=2, scale=0.3)
    assert_close(window_attention(q, k, v, **kwargs), naive_window_attention(q, k, v, **kwargs), rtol=1e-5)


@pytest.mark.skipif(DEV != "cuda", reason="bf16 and a model's sizes run on the GPU (the interpreter's bf16 dots)")
@pytest.mark.parametrize("compiled", [False, True])
def test_bf16_at_smollm2_size_on_cuda(compiled, assert_close):
    batch, length, heads_q, heads, dim = 1, 3000, 9, 3, 64
    positions, _ = packed_and_padded(batch, length)
    inputs = [torch.randn(batch, length, h, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
              for h in (heads_q, heads, heads)]
    kwargs = dict(positions=positions.cuda(), window=64, sinks=4, scale=dim ** -0.5)
    cotangent = torch.randn(batch, length, heads_q, dim, device="cuda")
    expected = run(naive_window_attention, [t.float() for t in inputs], cotangent, **kwargs)
    fn = torch.compile(triton_window_attention, fullgraph=True) if compiled else triton_window_attention
    assert_close(run(fn, inputs, cotangent, **kwargs), expected, rtol=2e-2)
