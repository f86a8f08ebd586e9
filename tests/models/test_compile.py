"""Converted models under torch.compile: each decoder layer compiled, the Triton kernels inside the graph as
torch.library custom ops (no graph break), loss and gradients equal to eager.

The Triton path runs through Triton's CPU interpreter here (tests/conftest.py), forced with T2R_OPS_BACKEND
(fp32 inputs would take the PyTorch forms otherwise). Head dim 64 and 64 slots: the smallest shapes that take
the GSA chunk kernels. One decoder layer: the kernels' input gradients still reach parameters (the q/k/v
projections); a second layer doubled the interpreted kernels of this, the suite's slowest file, and checked
nothing more.
"""
import pytest
import torch

import t2r
from tests.helpers.models import tiny_source

pytest.importorskip("triton")
from t2r.ops.common import triton_chunk as gla_kernels  # noqa: E402
from t2r.ops.fox import triton_parallel as fox_kernels  # noqa: E402
from t2r.ops.gated_delta import triton_chunk as gated_delta_kernels  # noqa: E402
from t2r.ops.gsa import triton_chunk as gsa_kernels  # noqa: E402


def loss_and_grads(model, ids, positions=None):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids, position_ids=positions, use_cache=False).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


# each target's kernel module and the host function its custom ops call once per layer forward and once in backward
CUSTOM_OPS = {"gla": (gla_kernels, "_states"), "retnet": (gla_kernels, "_states"), "gsa": (gsa_kernels, "_states"),
              "fox": (fox_kernels, "_prep_c"), "gdn": (gated_delta_kernels, "_states")}


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("target", ["gsa", "gla", "retnet", "fox", "gdn"])
def test_compiled_layers_match_eager(target, packed, monkeypatch):
    monkeypatch.setenv("T2R_OPS_BACKEND", "triton")
    torch._dynamo.reset()
    source = tiny_source("llama", hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                         num_hidden_layers=1, attn_implementation="sdpa")
    model = t2r.convert(source, target)
    ids = torch.randint(3, source.config.vocab_size, (1 if packed else 2, 140 if packed else 70))
    positions = torch.cat([torch.arange(60), torch.arange(80)])[None] if packed else None  # two documents
    eager_loss, eager_grads = loss_and_grads(model, ids, positions)
    for layer in model.model.layers:
        layer.compile(dynamic=False)
    counters = torch._dynamo.utils.counters
    counters.clear()
    calls = []
    kernels, name = CUSTOM_OPS[target]
    counted = getattr(kernels, name)
    monkeypatch.setattr(kernels, name, lambda *args: calls.append(1) or counted(*args))
    loss, grads = loss_and_grads(model, ids, positions)
    assert counters["stats"]["unique_graphs"] > 0
    assert dict(counters["graph_break"]) == {}  # the kernels run inside the graph, as torch.library custom ops
    assert len(calls) == 2 * len(model.model.layers)  # per layer: the forward, the backward's recompute
    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-5)
    assert grads.keys() == eager_grads.keys() and len(grads) > 0
    for name, grad in grads.items():
        torch.testing.assert_close(grad, eager_grads[name], rtol=1e-4, atol=1e-5, msg=name)
