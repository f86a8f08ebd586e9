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


@pytest.mark.parametrize("target, options", [("gsa", {}), ("gla", {}), ("retnet", {}), ("fox", {}), ("gdn", {}),
                                             ("gdn", {"window": 16, "sinks": 2})],
                         ids=["gsa", "gla", "retnet", "fox", "gdn", "gdn-window"])
def test_packed_batches_of_any_document_count_share_one_graph(target, options, monkeypatch):
    """Packed micro-batches as training passes them (`collate_packed`: the offsets `cu_seq_lens_q/k` beside the
    tokens), marked by `any_document_count` as the training stream does: the compiled layer takes a second batch
    of another document count with the graphs of the first (no recompilation: it had compiled every layer kind
    again for each new count) and without graph breaks (the op's check of the offsets read their values at every
    op: a break and a host sync a layer), with the eager model's loss and gradients."""
    from t2r.data.packing import collate_packed
    from t2r.models.compilation import any_document_count, compile_layers

    monkeypatch.setenv("T2R_OPS_BACKEND", "triton")
    torch._dynamo.reset()
    source = tiny_source("llama", hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                         num_hidden_layers=1, attn_implementation="sdpa")
    model = t2r.convert(source, target, **options)
    generator = torch.Generator().manual_seed(0)

    def batch(lengths):
        ids = torch.randint(3, source.config.vocab_size, (sum(lengths),), generator=generator)
        rows = [{"input_ids": ids, "position_ids": torch.cat([torch.arange(n) for n in lengths])}]
        return any_document_count(collate_packed(rows))

    def loss_and_grads_of(b):
        model.zero_grad(set_to_none=True)
        loss = model(**b).loss
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    batches = [batch([60, 80]), batch([30, 50, 40, 20])]
    eager = [loss_and_grads_of(b) for b in batches]
    compile_layers(model)
    counters = torch._dynamo.utils.counters
    counters.clear()
    for i, (b, (eager_loss, eager_grads)) in enumerate(zip(batches, eager)):
        loss, grads = loss_and_grads_of(b)
        if i == 0:
            graphs = counters["stats"]["unique_graphs"]
        torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-5)
        for name, grad in grads.items():
            torch.testing.assert_close(grad, eager_grads[name], rtol=1e-4, atol=1e-5, msg=name)
    assert graphs > 0 and counters["stats"]["unique_graphs"] == graphs  # the second count compiled nothing
    assert dict(counters["graph_break"]) == {}


def test_a_packed_batchs_longest_length_becomes_a_power_of_two_bound():
    """The longest document's length, which a compiled softmax layer would guard on (a graph per value), is rounded
    up to a power of two (varlen attention takes an upper bound); the offsets are untouched."""
    from t2r.data.packing import collate_packed
    from t2r.models.compilation import any_document_count

    for lengths, bound in (([60, 80], 128), ([1, 1], 1), ([64, 3], 64), ([65], 128), ([2048, 7], 2048)):
        rows = [{"input_ids": torch.arange(3, 3 + sum(lengths)),
                 "position_ids": torch.cat([torch.arange(n) for n in lengths])}]
        plain = collate_packed(rows)
        marked = any_document_count(collate_packed(rows))
        assert plain["max_length_q"] == max(lengths) and marked["max_length_q"] == marked["max_length_k"] == bound
        assert torch.equal(marked["cu_seq_lens_q"], plain["cu_seq_lens_q"])
