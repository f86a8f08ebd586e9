"""The optimizer every training path builds (`t2r.optim.build_optimizer`): torch's fused AdamW where the
parameters train on CUDA, which moves them as the default (foreach) form does."""

import pytest
import torch

from t2r.optim import build_optimizer


def params(device="cpu"):
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(n, 7, device=device)) for n in (3, 64, 5)]


@pytest.mark.parametrize("device, fused", [("cuda", True), (torch.device("cuda", 1), True), ("cpu", None),
                                           (None, None)])
def test_fused_where_the_parameters_train_on_cuda(device, fused):
    optimizer = build_optimizer(params(), 1e-3, device=device)  # still on the CPU: torch checks at the first step
    assert optimizer.defaults["fused"] is fused


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fused AdamW's kernel runs on CUDA")
def test_the_fused_steps_equal_the_default_ones():
    fused, default = params("cuda"), params("cuda")
    steps = [build_optimizer(fused, 1e-2, weight_decay=0.1, device="cuda"),
             build_optimizer(default, 1e-2, weight_decay=0.1)]
    assert steps[0].defaults["fused"] and not steps[1].defaults["fused"]
    for i in range(5):
        torch.manual_seed(i)
        grads = [torch.randn_like(p) for p in fused]
        for group, optimizer in zip((fused, default), steps):
            for p, g in zip(group, grads):
                p.grad = g.clone()
            optimizer.step()
    for a, b in zip(fused, default):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_fused_steps_on_fsdp2s_sharded_parameters_equal_the_default_ones_on_whole_ones():
    import os

    from tests.helpers.recipes import torchrun, torchrun_failure

    done = torchrun(["-m", "tests.helpers.fused_adamw_sharded"], {**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        pytest.fail(torchrun_failure(done.stderr))
    kind, difference = done.stdout.split()[-2:]
    assert kind == "DTensor" and float(difference) < 1e-6
