"""The chunked, output-projection-fused distillation losses equal the plain ones, forward and backward."""

import pytest
import torch
import torch.nn.functional as F

from t2r.train.kl import chunked_distill_losses, chunked_kl, plain_distill_losses, shift_labels
from t2r.train.losses import distill_kl

VOCAB, HIDDEN, TEACHER_HIDDEN = 61, 24, 20


def rel_err(out, ref):
    out, ref = out.detach().double(), ref.detach().double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def make(shape, dtype=torch.float32, seed=0):
    """Student hidden states and head weight (leaves), the teacher's hidden states, head weight and logits."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(*shape, HIDDEN, generator=g).mul(2).requires_grad_(True)
    weight = torch.randn(VOCAB, HIDDEN, generator=g).div(HIDDEN ** 0.5).requires_grad_(True)
    t_hidden = torch.randn(*shape, TEACHER_HIDDEN, generator=g).mul(2).to(dtype)
    t_weight = torch.randn(VOCAB, TEACHER_HIDDEN, generator=g).div(TEACHER_HIDDEN ** 0.5).to(dtype)
    return hidden, weight, t_hidden, t_weight


def autocast_or_not(dtype):
    if dtype == torch.bfloat16:
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def plain(hidden, weight, t_hidden, t_weight, t, dtype, **kw):
    with autocast_or_not(dtype):
        student_logits = F.linear(hidden, weight)
        teacher_logits = F.linear(t_hidden, t_weight)
    return plain_distill_losses(student_logits, teacher_logits, t, **kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape,chunk", [((2, 13), 5), ((1, 7), 64), ((3, 11), 1), ((33,), 8)])
@pytest.mark.parametrize("temperature", [1.0, 2.5])
def test_chunked_kl_equals_plain_kl(dtype, shape, chunk, temperature):
    """Forward and gradients for the student's hidden states and head weight, from the teacher's hidden states,
    under bf16 autocast as in training (the teacher in bf16) or in fp32; odd token counts and chunks that do
    not divide them."""
    hidden, weight, t_hidden, t_weight = make(shape, dtype)
    ref = plain(hidden, weight, t_hidden, t_weight, temperature, dtype).kl
    ref_h, ref_w = torch.autograd.grad(ref, (hidden, weight))
    with autocast_or_not(dtype):
        out = chunked_kl(hidden, weight, t_hidden, t_weight, temperature=temperature, chunk_tokens=chunk)
    out_h, out_w = torch.autograd.grad(out, (hidden, weight))
    tol = 1e-6 if dtype == torch.float32 else 2e-2
    assert out.dtype == torch.float32 and out.shape == ()
    assert abs(out.item() - ref.item()) <= tol * max(ref.item(), 1.0)
    assert rel_err(out_h, ref_h) < tol and rel_err(out_w, ref_w) < tol
    assert out_h.dtype == hidden.dtype and out_w.dtype == weight.dtype


def test_equals_the_training_loops_distill_kl_times_t_squared():
    hidden, weight, t_hidden, t_weight = make((2, 9))
    teacher_logits = F.linear(t_hidden, t_weight)
    ref = 2.0 ** 2 * distill_kl(F.linear(hidden, weight), teacher_logits, 2.0)
    out = chunked_kl(hidden, weight, teacher_logits=teacher_logits, temperature=2.0, chunk_tokens=4)
    assert abs(out.item() - ref.item()) < 1e-6 * ref.item()
    ref.backward()
    grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    out.backward()
    assert rel_err(hidden.grad, grads[0]) < 1e-6 and rel_err(weight.grad, grads[1]) < 1e-6


def test_teacher_logits_and_teacher_hidden_give_the_same_loss():
    hidden, weight, t_hidden, t_weight = make((2, 10))
    a = chunked_kl(hidden, weight, t_hidden, t_weight, chunk_tokens=3)
    teacher_logits = F.linear(t_hidden, t_weight)
    before = teacher_logits.clone()
    b = chunked_kl(hidden, weight, teacher_logits=teacher_logits, chunk_tokens=7)
    assert abs(a.item() - b.item()) < 1e-6 * a.item()
    assert torch.equal(teacher_logits, before)  # the chunks work in place on copies, never on the caller's logits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mask_and_next_token_loss_equal_plain(dtype):
    """Dropped tokens (padding) count in neither the sum nor the mean; the cross-entropy of shifted labels
    skips ignore_index, as transformers' causal-LM loss does; a weighted sum of both backpropagates."""
    hidden, weight, t_hidden, t_weight = make((2, 12), dtype)
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[0, :3] = False  # left padding
    mask[1, -5:] = False  # right padding
    ids = torch.randint(0, VOCAB, (2, 12))
    ids[0, 4] = -100
    labels = shift_labels(ids)
    ref = plain(hidden, weight, t_hidden, t_weight, 1.5, dtype, mask=mask, labels=labels)
    ref_grads = torch.autograd.grad(0.3 * ref.kl + 0.7 * ref.next_token, (hidden, weight))
    with autocast_or_not(dtype):
        out = chunked_distill_losses(hidden, weight, t_hidden, t_weight, temperature=1.5, mask=mask, labels=labels,
                                     chunk_tokens=5)
    grads = torch.autograd.grad(0.3 * out.kl + 0.7 * out.next_token, (hidden, weight))
    tol = 1e-6 if dtype == torch.float32 else 2e-2
    assert abs(out.kl.item() - ref.kl.item()) <= tol * ref.kl.item()
    assert abs(out.next_token.item() - ref.next_token.item()) <= tol * ref.next_token.item()
    assert all(rel_err(g, r) < tol for g, r in zip(grads, ref_grads))
    assert grads[0][~mask].abs().sum() > 0  # dropped tokens still get the next-token gradient


def test_masked_tokens_get_no_kl_gradient_and_labels_match_the_models_own_loss():
    hidden, weight, t_hidden, t_weight = make((1, 8))
    mask = torch.tensor([[False, False, True, True, True, True, True, False]])
    grad = torch.autograd.grad(chunked_kl(hidden, weight, t_hidden, t_weight, mask=mask, chunk_tokens=3), hidden)[0]
    assert grad[~mask].abs().max() == 0 and grad[mask].abs().max() > 0
    ids = torch.randint(0, VOCAB, (1, 8))
    logits = F.linear(hidden, weight)
    from transformers.loss.loss_utils import ForCausalLMLoss

    out = chunked_distill_losses(hidden, weight, t_hidden, t_weight, labels=shift_labels(ids), chunk_tokens=3)
    assert abs(out.next_token.item() - ForCausalLMLoss(logits, ids, VOCAB).item()) < 1e-5


def test_frozen_head_and_frozen_hidden():
    hidden, weight, t_hidden, t_weight = make((2, 5))
    weight.requires_grad_(False)
    out = chunked_kl(hidden, weight, t_hidden, t_weight, chunk_tokens=4)
    assert torch.autograd.grad(out, hidden)[0].shape == hidden.shape
    hidden.requires_grad_(False)
    weight.requires_grad_(True)
    out = chunked_kl(hidden, weight, t_hidden, t_weight, chunk_tokens=4)
    assert torch.autograd.grad(out, weight)[0].shape == weight.shape


def test_errors_name_the_problem():
    hidden, weight, t_hidden, t_weight = make((2, 5))
    with pytest.raises(ValueError, match="not both"):
        chunked_kl(hidden, weight, t_hidden, t_weight, teacher_logits=torch.zeros(2, 5, VOCAB))
    with pytest.raises(ValueError, match="not both"):
        chunked_kl(hidden, weight)
    with pytest.raises(ValueError, match="teacher_logits"):
        chunked_kl(hidden, weight, teacher_logits=torch.zeros(2, 5, VOCAB + 1))
    with pytest.raises(ValueError, match="student_weight"):
        chunked_kl(hidden, weight.t(), t_hidden, t_weight)
    with pytest.raises(ValueError, match="mask"):
        chunked_kl(hidden, weight, t_hidden, t_weight, mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="temperature"):
        chunked_kl(hidden, weight, t_hidden, t_weight, temperature=0.0)


def test_a_distill_stage_trains_the_same_with_the_fused_kl(tmp_path, source_dir, corpus):
    """train.fused_kl (the default) against the plain loss on whole logits: the same KL and next-token parts at
    every step (the later steps after the earlier steps' updates), up to rounding. (Weights are not compared:
    Adam turns rounding-level differences in a near-zero gradient into lr-sized steps.)"""
    import json

    from t2r.train import finetune
    from tests.helpers.recipes import recipe

    runs = {}
    for fused in (True, False):
        r = recipe(tmp_path, source_dir, corpus, run=f"fused-{fused}", **{
            "stages.distill.weight": 0.75, "stages.distill.temperature": 2, "train.max_steps": 3,
            "train.fused_kl": fused, "data.held_out": 0})
        finetune(r)
        rows = [json.loads(line) for line in (tmp_path / f"fused-{fused}" / "metrics.jsonl").read_text().splitlines()]
        runs[fused] = [(m["loss_kl"], m["loss_next_token"]) for m in rows if "loss" in m]
    assert len(runs[True]) == 3
    for (kl, ce), (plain_kl, plain_ce) in zip(runs[True], runs[False]):
        assert kl == pytest.approx(plain_kl, rel=1e-4) and ce == pytest.approx(plain_ce, rel=1e-5)


def test_a_teacher_run_under_inference_mode():
    """The teacher's forward runs under torch.inference_mode: its hidden states and logits are inference
    tensors, which the loss reads but never saves for backward."""
    hidden, weight, t_hidden, t_weight = make((2, 7))
    ref = chunked_kl(hidden, weight, t_hidden, t_weight, chunk_tokens=3)
    with torch.inference_mode():
        t_hidden, t_weight = t_hidden.clone(), t_weight.clone()
        teacher_logits = F.linear(t_hidden, t_weight)
    for kwargs in (dict(teacher_hidden=t_hidden, teacher_weight=t_weight), dict(teacher_logits=teacher_logits)):
        out = chunked_kl(hidden, weight, chunk_tokens=3, **kwargs)
        out.backward()
        assert abs(out.item() - ref.item()) < 1e-6 * ref.item() and hidden.grad is not None
