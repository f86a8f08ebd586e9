"""The per-token distillation kernel (`t2r.ops.distill_rows`) against its PyTorch reference: row losses and the
logit gradients it writes in place; on a GPU, the fused chunk loop of `t2r.train.kl` against the plain one."""
import pytest
import torch

from tests.helpers.triton import DEV, INTERPRET, checked_memory, require_triton

require_triton()

from t2r.ops.distill_rows import distill_rows, distill_rows_reference  # noqa: E402


@pytest.mark.parametrize("rows, vocab", [(5, 61), (3, 2048), (4, 4100)])
@pytest.mark.parametrize("temperature", [1.0, 2.5])
@pytest.mark.parametrize("with_labels", [True, False])
def test_kernel_equals_the_reference(rows, vocab, temperature, with_labels):
    g = torch.Generator().manual_seed(rows * vocab)
    student = (torch.randn(rows, vocab, generator=g) * 3).to(DEV)
    teacher = (torch.randn(rows, vocab, generator=g) * 3).to(DEV)
    teacher[0, : vocab // 2] = -1e4  # a teacher certain of half the vocabulary: p underflows to 0 there
    labels = torch.randint(0, vocab, (rows,), generator=g).to(DEV) if with_labels else None
    if with_labels:
        labels[1] = -100
    outs = []
    for fn in (distill_rows_reference, distill_rows):
        s, u = student.clone(), teacher.clone()
        with checked_memory():
            row_kl, row_ce = fn(s, u, labels, temperature, kl_scale=0.7, ce_scale=0.3)
        outs.append((row_kl, row_ce, s, u if with_labels else None))
    for want, got in zip(*outs):
        if want is None:
            assert got is None
            continue
        torch.testing.assert_close(got, want, rtol=1e-5 if INTERPRET else 1e-4, atol=1e-6)
    if with_labels:
        assert outs[1][1][1] == 0 and outs[1][3][1].abs().sum() == 0  # an ignored label: no loss, no gradient


@pytest.mark.skipif(DEV != "cuda", reason="the fused chunk loop runs on CUDA in bf16")
def test_fused_chunks_equal_plain_chunks_in_bf16(monkeypatch):
    import t2r.train.kl as kl

    g = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(2, 700, 96, device="cuda", generator=g).requires_grad_(True)
    weight = (torch.randn(5000, 96, device="cuda", generator=g) / 10).requires_grad_(True)
    t_hidden = torch.randn(2, 700, 64, device="cuda", generator=g).bfloat16()
    t_weight = (torch.randn(5000, 64, device="cuda", generator=g) / 8).bfloat16()
    labels = torch.randint(0, 5000, (2, 700), device="cuda", generator=g)
    mask = torch.ones(2, 700, dtype=torch.bool, device="cuda")
    mask[1, :50] = False
    results = []
    for fused in (False, True):
        monkeypatch.setattr(kl, "_fused_rows", lambda *a, fused=fused: fused)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = kl.chunked_distill_losses(hidden, weight, t_hidden, t_weight, temperature=1.5, labels=labels,
                                            mask=mask, chunk_tokens=256)
        grads = torch.autograd.grad(0.9 * out.kl + 0.1 * out.next_token, (hidden, weight))
        results.append([out.kl, out.next_token, *grads])
    for want, got in zip(*results):
        assert ((got.float() - want.float()).norm() / want.float().norm()).item() < 1e-2
