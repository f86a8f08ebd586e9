"""On a GPU: converted models give the same logits and gradients through the Triton kernels as through the
PyTorch chunkwise ops, and decode consistently. Skipped where there is no CUDA device (CI).

The comparison runs in bf16, the precision the kernels serve automatically (fp32 inputs take the exact
PyTorch forms, see t2r.ops.backend); both paths are in bf16, so the tolerance is bf16's."""

import pytest
import torch

import t2r
from tests.helpers.models import tiny_source

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def run(model, ids, backend, monkeypatch):
    monkeypatch.setenv("T2R_OPS_BACKEND", backend)
    model.zero_grad()
    out = model(ids, labels=ids)
    out.loss.backward()
    grads = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.float().detach(), grads


@pytest.mark.parametrize("length", [64, 200])
def test_triton_and_torch_backends_agree(arch, target, length, monkeypatch):
    dtype, tol = torch.bfloat16, 5e-2
    # head_dim 64 as in SmolLM2: the kernels' real shapes
    model = t2r.convert(tiny_source(arch, hidden_size=256, num_attention_heads=4, num_key_value_heads=2),
                        target).to("cuda", dtype).train()
    ids = torch.randint(3, 97, (2, length), device="cuda")
    logits_torch, grads_torch = run(model, ids, "torch", monkeypatch)
    logits_triton, grads_triton = run(model, ids, "triton", monkeypatch)
    rel = (logits_triton - logits_torch).norm() / logits_torch.norm()
    assert rel < tol
    for name, grad in grads_torch.items():
        rel = (grads_triton[name] - grad).norm() / grad.norm().clamp_min(1e-12)
        assert rel < tol * 4, name


def test_prefill_then_decode_on_cuda(arch, target):
    model = t2r.convert(tiny_source(arch, hidden_size=256, num_attention_heads=4, num_key_value_heads=2),
                        target).to("cuda", torch.bfloat16).eval()
    ids = torch.randint(3, 97, (3, 90), device="cuda")
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        out = model(ids[:, :70], use_cache=True)
        steps = [out.logits]
        for t in range(70, 90):
            out = model(ids[:, t:t + 1], past_key_values=out.past_key_values, use_cache=True)
            steps.append(out.logits)
    rel = (torch.cat(steps, 1) - full).float().norm() / full.float().norm()
    assert rel < 2e-2  # bf16: chunkwise kernel for the prefill, recurrent kernel for the steps
