"""Converted models train: gradients reach the gates and projections; packed documents do not leak."""

import pytest
import torch

import t2r
from tests.helpers.models import small, tiny_source


def test_one_step_reduces_loss_and_trains_the_gates(target):
    model = t2r.convert(tiny_source("llama"), target, **small(target)).train()
    ids = torch.randint(3, 97, (4, 24))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = model(ids, labels=ids).loss
    first.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    gate_grads = [g for n, g in grads.items() if "gate" in n]
    assert target == "retnet" or any(g.abs().sum() > 0 for g in gate_grads)
    optimizer.step()
    optimizer.zero_grad()
    for _ in range(3):
        loss = model(ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert loss < first


def test_packed_documents_equal_separate_runs(target):
    """cu_seq_lens_q (as transformers' flattening collator passes it) keeps documents apart."""
    model = t2r.convert(tiny_source("qwen2"), target, **small(target))
    a, b = torch.randint(3, 97, (1, 10)), torch.randint(3, 97, (1, 7))
    packed = torch.cat([a, b], 1)
    position_ids = torch.cat([torch.arange(10), torch.arange(7)])[None]
    cu = torch.tensor([0, 10, 17], dtype=torch.int32)
    with torch.no_grad():
        together = model(packed, position_ids=position_ids, cu_seq_lens_q=cu, cu_seq_lens_k=cu).logits
        separate = torch.cat([model(a).logits, model(b).logits], 1)
    torch.testing.assert_close(together, separate, rtol=1e-4, atol=1e-4)


def test_gradient_checkpointing_gives_the_same_gradients():
    model = t2r.convert(tiny_source("mistral"), "gsa", num_slots=8).train()
    ids = torch.randint(3, 97, (2, 12))
    model(ids, labels=ids).loss.backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.gradient_checkpointing_enable()
    model(ids, labels=ids).loss.backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[n], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("target", ["fox", "gla"])
def test_mixed_precision_gives_the_mixer_one_dtype(target, monkeypatch):
    """Under bf16 autocast, RoPE's fp32 cos/sin used to promote q and k to fp32 while v stayed bf16: FoX's
    kernels refuse mixed dtypes and fell back to the slow PyTorch form. The mixer now gets one dtype."""
    from t2r.layers import base

    seen = []
    real = base.ConvertedAttention.project
    monkeypatch.setattr(base.ConvertedAttention, "project",
                        lambda self, *a: seen.append({t.dtype for t in real(self, *a)}) or real(self, *a))
    model = t2r.convert(tiny_source("llama"), target, rope=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.randint(3, 97, (1, 16)), use_cache=False)
    assert seen and all(dtypes == {torch.bfloat16} for dtypes in seen), seen
