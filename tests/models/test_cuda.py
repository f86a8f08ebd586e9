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
    """The bf16 model through the Triton kernels against the same model through PyTorch, each against the fp32
    model: a gradient summed over every token (a gate's bias) carries the bf16 model's rounding whatever the
    backend (measured on the H100: gdn's beta_bias 0.24 from fp32 through PyTorch, 0.45 through Triton), so
    the kernels' error may be up to twice PyTorch's, or within the tolerance."""
    dtype, tol = torch.bfloat16, 5e-2
    # head_dim 64 as in SmolLM2: the kernels' real shapes
    model = t2r.convert(tiny_source(arch, hidden_size=256, num_attention_heads=4, num_key_value_heads=2),
                        target).to("cuda").train()
    ids = torch.randint(3, 97, (2, length), device="cuda")
    logits_fp32, grads_fp32 = run(model, ids, "torch", monkeypatch)
    model.to(dtype)
    logits_torch, grads_torch = run(model, ids, "torch", monkeypatch)
    logits_triton, grads_triton = run(model, ids, "triton", monkeypatch)

    def error(x, reference):
        return ((x - reference).norm() / reference.norm().clamp_min(1e-12)).item()

    assert error(logits_triton, logits_torch) < tol
    for name, grad in grads_fp32.items():
        assert error(grads_triton[name], grad) < max(tol * 4, 2 * error(grads_torch[name], grad)), name


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
