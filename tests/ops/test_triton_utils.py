"""The shared reverse cumulative sum of the gate gradients (t2r/ops/triton_utils.py) vs torch; the
interpreter's address check of the kernel tests (tests.helpers.triton.checked_memory)."""
import pytest
import torch

from tests.helpers.triton import DEV, INTERPRET, OutOfBounds, checked_memory, require_triton

triton = require_triton()

import triton.language as tl  # noqa: E402

from t2r.ops.triton_utils import reverse_cumsum  # noqa: E402


def reference(x, carry, cu_seqlens):
    """carry + sum over s >= t within each sequence, in float64."""
    x = x.double()
    bounds = [0, x.shape[1]] if cu_seqlens is None else cu_seqlens.tolist()
    out = torch.empty_like(x)
    for b in range(x.shape[0]):
        for n, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
            part = x[b, lo:hi].flip(0).cumsum(0).flip(0)
            if carry is not None:
                part = part + carry[b if cu_seqlens is None else n].double()
            out[b, lo:hi] = part
    return out


@pytest.mark.parametrize("D", [None, 5, 64])   # scalar gates, ragged D, full block
@pytest.mark.parametrize("T,segment", [(1, 64), (200, 64), (700, 128), (1000, 512)])
@pytest.mark.parametrize("with_carry", [False, True])
def test_reverse_cumsum(D, T, segment, with_carry):
    gen = torch.Generator().manual_seed(T + (D or 0))
    B, H = 2, 3
    shape = (B, T, H) if D is None else (B, T, H, D)
    x = torch.randn(shape, generator=gen)
    carry = torch.randn((B, H) if D is None else (B, H, D), generator=gen) if with_carry else None
    y = reverse_cumsum(x.to(DEV), torch.float32, None if carry is None else carry.to(DEV), segment=segment)
    torch.testing.assert_close(y.cpu().double(), reference(x, carry, None), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("segment", [64, 192])
def test_reverse_cumsum_packed(segment):
    """Packed sequences never sum across their boundaries, with any segment length."""
    bounds = [0, 1, 130, 140, 500]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, bounds[-1], 2, 7, generator=gen)
    carry = torch.randn(len(bounds) - 1, 2, 7, generator=gen)
    cu = torch.tensor(bounds, dtype=torch.int32)
    y = reverse_cumsum(x.to(DEV), torch.float32, carry.to(DEV), cu.to(DEV), segment=segment)
    torch.testing.assert_close(y.cpu().double(), reference(x, carry, cu), rtol=1e-5, atol=1e-4)


def test_reverse_cumsum_rejects_bad_segment():
    with pytest.raises(AssertionError, match="multiple of 64"):
        reverse_cumsum(torch.zeros(1, 8, 1, 4, device=DEV), torch.float32, segment=100)


@triton.jit
def _copy_kernel(x, y, n, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(y + o, tl.load(x + o, mask=o < n), mask=o < n)


@pytest.mark.skipif(not INTERPRET, reason="the address check runs in the interpreter")
def test_checked_memory_flags_an_access_past_a_tensor():
    """The check the kernel tests rely on: a load one element past its tensor raises (before the store)."""
    x, y = torch.randn(10), torch.empty(10)
    with checked_memory():
        _copy_kernel[(1,)](x, y, 10, BLOCK=16)
        assert torch.equal(x, y)
        with pytest.raises(Exception, match=f"{OutOfBounds.__name__}.*_copy_kernel: load of 1 of 11 elements"):
            _copy_kernel[(1,)](x, y, 11, BLOCK=16)
