"""The shared reverse cumulative sum of the gate gradients (t2r/ops/triton_utils.py) vs torch."""
import pytest
import torch

from tests.helpers.triton import DEV, require_triton

require_triton()

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
