"""`average_gradients`, the hand-made gradient mean of a loss outside the model's forward (attention MSE under
DDP): few all-reduces, each over a flat bucket, in the precision `train.gradient_sync` names."""

import pytest
import torch

from t2r.train.gradient_sync import average_gradients


class TwoRanks:
    """An accelerator of two processes whose other process holds `other` (flat, in call order)."""

    def __init__(self, other: list):
        self.other, self.calls = list(other), []

    def reduce(self, tensor, reduction):
        assert reduction == "mean"
        self.calls.append((tensor.dtype, tensor.numel()))
        return (tensor + self.other.pop(0).to(tensor.dtype)) / 2


def params(shapes, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    for shape in shapes:
        p = torch.nn.Parameter(torch.zeros(shape))
        p.grad = torch.randn(shape, generator=g)
        out.append(p)
    return out


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_mean_of_two_processes_in_buckets(precision):
    shapes = [(7, 5), (3,), (64, 9), (1,), (11, 2)]
    mine, theirs = params(shapes, 0), params(shapes, 1)
    wire = (lambda t: t.bfloat16().float()) if precision == "bf16" else (lambda t: t)
    expected = [(wire(a.grad) + wire(b.grad)) / 2 for a, b in zip(mine, theirs)]
    if precision == "bf16":
        expected = [e.bfloat16().float() for e in expected]  # the mean comes back in bf16 too
    bucket_bytes = 4 * 64 * 9  # the third gradient fills a bucket: two buckets
    flat = [torch.cat([t.grad.flatten() for t in theirs[:3]]), torch.cat([t.grad.flatten() for t in theirs[3:]])]
    accelerator = TwoRanks(flat)
    average_gradients(accelerator, mine + [torch.nn.Parameter(torch.zeros(2))], precision, bucket_bytes)  # no grad
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    assert accelerator.calls == [(dtype, 35 + 3 + 576), (dtype, 1 + 22)]
    for p, e in zip(mine, expected):
        assert p.grad.dtype == torch.float32
        torch.testing.assert_close(p.grad, e, rtol=0, atol=0)


def test_ddp_does_not_broadcast_the_buffers_before_each_forward():
    """t2r's buffers are built alike on every rank and never change: DDP's broadcast of them from rank 0 at every
    forward only made the ranks meet at every micro-batch (two processes still train like one:
    test_distributed.py::test_two_processes_equal_one)."""
    from t2r.train.finetuning import _accelerator
    from tests.helpers.recipes import make_recipe

    accelerator = _accelerator(make_recipe(check_files=False))
    assert accelerator.ddp_handler.to_kwargs()["broadcast_buffers"] is False


def test_ddp_buckets_its_all_reduce_as_the_recipe_says():
    """`train.gradient_bucket_mb` reaches DDP (torch's default, 25 MiB, where the recipe is silent)."""
    from t2r.train.finetuning import _accelerator
    from tests.helpers.recipes import make_recipe

    assert _accelerator(make_recipe(check_files=False)).ddp_handler.to_kwargs().get("bucket_cap_mb", 25) == 25
    recipe = make_recipe("train.gradient_bucket_mb=1024", check_files=False)
    assert _accelerator(recipe).ddp_handler.to_kwargs()["bucket_cap_mb"] == 1024
