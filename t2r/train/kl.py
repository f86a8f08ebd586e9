"""Distillation losses fused with the output projection, chunk by chunk over tokens.

The plain loss (`t2r.train.losses.distill_kl`) materialises both models' logits for a whole micro-batch, in
fp32 several times over (logits, log-softmax, the teacher's, the gradient): at 8 x 2048 tokens and SmolLM2's
49,152-token vocabulary that is 3.2 GB per fp32 copy. Here each chunk of `chunk_tokens` tokens runs

    logits = hidden @ W^T (compute dtype) -> log_softmax in fp32 -> KL (and cross-entropy) -> d loss / d logits

and the chunk's logits are dropped once its contribution to d loss / d hidden and d loss / d W is added; the
backward only scales what the forward computed (as Liger-Kernel's fused linear cross-entropy and JSD do), so
peak memory is O(chunk x vocab) instead of O(tokens x vocab).

    T^2 KL(p_teacher || q_student) = T^2 / N sum_tokens sum_v p_v (log p_v - log q_v),  p, q = softmax(logits / T)
    d / d logits_student = T (q - p) / N

(Hinton et al. 2015: T^2 keeps the gradient's scale across temperatures.) N counts the tokens kept by `mask`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

DEFAULT_CHUNK_TOKENS = 1024
"""Tokens per chunk: at a 49,152-token vocabulary one fp32 chunk of logits is 200 MB."""


class DistillLosses(NamedTuple):
    kl: torch.Tensor
    """T^2 KL(teacher || student), mean over the kept tokens (`distill_kl` x T^2)."""
    next_token: torch.Tensor | None
    """Cross-entropy of the labels (T = 1), mean over labels that are not `ignore_index`; None without labels."""


def chunked_kl(student_hidden: torch.Tensor, student_weight: torch.Tensor, teacher_hidden: torch.Tensor | None = None,
               teacher_weight: torch.Tensor | None = None, *, teacher_logits: torch.Tensor | None = None,
               temperature: float = 1.0, mask: torch.Tensor | None = None,
               chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> torch.Tensor:
    """T^2 KL(teacher || student) per token, without the whole micro-batch's logits.

    student_hidden `[..., H]`: the student's final hidden states (what its output head reads); student_weight
    `[V, H]`: that head's weight (gradients flow to both). The teacher is either `teacher_hidden` `[..., H']`
    with `teacher_weight` `[V, H']`, or its `teacher_logits` `[..., V]` (no gradient either way). `mask`
    `[...]` (bool): tokens to count (default all). Logits are computed in the autocast dtype when autocast is
    on, else in the hidden states' dtype, and normalised in fp32. Returns a scalar equal to
    `temperature**2 * distill_kl(student_logits, teacher_logits, temperature)`."""
    return chunked_distill_losses(student_hidden, student_weight, teacher_hidden, teacher_weight,
                                  teacher_logits=teacher_logits, temperature=temperature, mask=mask,
                                  chunk_tokens=chunk_tokens).kl


def chunked_distill_losses(student_hidden: torch.Tensor, student_weight: torch.Tensor,
                           teacher_hidden: torch.Tensor | None = None, teacher_weight: torch.Tensor | None = None, *,
                           teacher_logits: torch.Tensor | None = None, temperature: float = 1.0,
                           mask: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                           ignore_index: int = -100, chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> DistillLosses:
    """`chunked_kl`'s KL and, with `labels` `[...]` (the target token of each position, already shifted: see
    `shift_labels`), the next-token cross-entropy from the same chunks of student logits. Both are
    differentiable; weight and add them as the recipe says."""
    lead = student_hidden.shape[:-1]
    if student_weight.dim() != 2 or student_weight.shape[1] != student_hidden.shape[-1]:
        raise ValueError(f"student_weight {tuple(student_weight.shape)} is not [vocab, {student_hidden.shape[-1]}] "
                         "(the output head's weight for these hidden states)")
    if (teacher_logits is None) == (teacher_hidden is None):
        raise ValueError("give the teacher as teacher_hidden + teacher_weight or as teacher_logits, not both")
    vocab = student_weight.shape[0]
    if teacher_logits is not None:
        if teacher_logits.shape != (*lead, vocab):
            raise ValueError(f"teacher_logits {tuple(teacher_logits.shape)} should be {(*lead, vocab)}")
        teacher = teacher_logits.detach().reshape(-1, vocab)
    else:
        if teacher_weight is None or teacher_hidden.shape[:-1] != lead or teacher_weight.shape != (
                vocab, teacher_hidden.shape[-1]):
            raise ValueError(f"teacher_hidden {tuple(teacher_hidden.shape)} with teacher_weight "
                             f"{None if teacher_weight is None else tuple(teacher_weight.shape)}: expected "
                             f"[{', '.join(map(str, lead))}, H'] and [{vocab}, H']")
        teacher = (teacher_hidden.detach().reshape(-1, teacher_hidden.shape[-1]), teacher_weight.detach())
    for name, tensor in (("mask", mask), ("labels", labels)):
        if tensor is not None and tensor.shape != lead:
            raise ValueError(f"{name} {tuple(tensor.shape)} should be {tuple(lead)}, one per token")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    device = student_hidden.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else student_hidden.dtype
    teacher_dtype = (torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device)
                     else teacher_hidden.dtype) if teacher_hidden is not None else None
    kl, ce = _FusedDistill.apply(
        student_hidden.reshape(-1, student_hidden.shape[-1]), student_weight, teacher,
        None if mask is None else mask.reshape(-1).bool(), None if labels is None else labels.reshape(-1),
        ignore_index, float(temperature), int(chunk_tokens), dtype, teacher_dtype)
    return DistillLosses(kl, ce if labels is not None else None)


def _log_softmax_(x: torch.Tensor, t: float) -> torch.Tensor:
    """log_softmax(x / t) in place."""
    if t != 1:
        x.div_(t)
    return x.sub_(x.logsumexp(-1, keepdim=True))


def shift_labels(labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """`[B, T]` labels as the model takes them -> the target of each position: labels[:, 1:] and `ignore_index`
    last, as transformers' causal-LM loss shifts them."""
    return F.pad(labels[..., 1:], (0, 1), value=ignore_index)


def plain_distill_losses(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0,
                         mask: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                         ignore_index: int = -100) -> DistillLosses:
    """The reference: the same losses from whole logits (what `chunked_distill_losses` must equal)."""
    t = temperature
    keep = torch.ones(student_logits.shape[:-1], dtype=torch.bool, device=student_logits.device) if mask is None \
        else mask.bool()
    student = F.log_softmax(student_logits.float()[keep] / t, -1)
    target = F.log_softmax(teacher_logits.float()[keep] / t, -1)
    kl = t * t * F.kl_div(student, target, log_target=True, reduction="sum") / max(int(keep.sum()), 1)
    ce = None
    if labels is not None:
        ce = F.cross_entropy(student_logits.float().flatten(0, -2), labels.flatten(), ignore_index=ignore_index)
    return DistillLosses(kl, ce)


class _FusedDistill(torch.autograd.Function):
    """Forward: both losses and their gradients for the student's hidden states and head weight, chunk by
    chunk; backward: those gradients times the incoming ones."""

    @staticmethod
    def forward(ctx, hidden, weight, teacher, mask, labels, ignore_index, t, chunk, dtype, teacher_dtype):
        n = hidden.shape[0]
        kept = n if mask is None else int(mask.sum())
        counted = 0 if labels is None else int((labels != ignore_index).sum())
        want_h, want_w = hidden.requires_grad, weight.requires_grad
        with torch.autocast(hidden.device.type, enabled=False), torch.no_grad():
            w = weight.to(dtype)
            if isinstance(teacher, tuple):
                teacher = (teacher[0], teacher[1].to(teacher_dtype))
            grads = {part: (torch.zeros_like(hidden) if want_h else None,
                            torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_w else None)
                     for part in (("kl", "ce") if labels is not None else ("kl",))}
            kl_sum = torch.zeros((), dtype=torch.float64, device=hidden.device)
            ce_sum = torch.zeros((), dtype=torch.float64, device=hidden.device)
            def add(part: str, g: torch.Tensor, rows: slice, h: torch.Tensor) -> None:
                """d loss / d logits of one chunk -> its share of d loss / d hidden and d loss / d W."""
                g = g.to(dtype)
                grad_h, grad_w = grads[part]
                if want_h:
                    grad_h[rows] = g @ w
                if want_w:
                    grad_w += (g.t() @ h).float()

            if isinstance(teacher, tuple) and _fused_rows(hidden, dtype, teacher_dtype):
                _chunks_fused(hidden, w, teacher, mask, labels, ignore_index, t, chunk, dtype, teacher_dtype, kept,
                              counted, add, kl_sum, ce_sum)
            else:
                _chunks_plain(hidden, w, teacher, mask, labels, ignore_index, t, chunk, dtype, teacher_dtype, kept,
                              counted, add, kl_sum, ce_sum)
        ctx.grads = grads
        ctx.dtypes = hidden.dtype, weight.dtype
        kl = (kl_sum * t * t / max(kept, 1)).float()
        ce = (ce_sum / max(counted, 1)).float() if labels is not None else torch.zeros((), device=hidden.device)
        return kl, ce

    @staticmethod
    def backward(ctx, grad_kl, grad_ce):
        grad_hidden = grad_weight = None
        for part, scale in (("kl", grad_kl), ("ce", grad_ce)):
            if part not in ctx.grads or scale is None:
                continue
            grad_h, grad_w = ctx.grads[part]
            if grad_h is not None:
                grad_hidden = grad_h * scale.to(grad_h.dtype) if grad_hidden is None else grad_hidden + grad_h * scale
            if grad_w is not None:
                grad_weight = grad_w * scale if grad_weight is None else grad_weight + grad_w * scale
        ctx.grads = None
        if grad_weight is not None:
            grad_weight = grad_weight.to(ctx.dtypes[1])
        return grad_hidden, grad_weight, None, None, None, None, None, None, None, None


def _fused_rows(hidden: torch.Tensor, dtype: torch.dtype, teacher_dtype: torch.dtype) -> bool:
    """Whether a chunk's losses and logit gradients run as one Triton kernel (`t2r.ops.distill_rows`): CUDA, half
    precision logits of both models, Triton available."""
    if not hidden.is_cuda or dtype not in (torch.bfloat16, torch.float16) or teacher_dtype not in (torch.bfloat16,
                                                                                                  torch.float16):
        return False
    from t2r.ops.backend import use_triton

    return use_triton(hidden.new_empty(0, dtype=dtype))


def _chunks_fused(hidden, w, teacher, mask, labels, ignore_index, t, chunk, dtype, teacher_dtype, kept, counted, add,
                  kl_sum, ce_sum) -> None:
    """The chunk loop with the per-token math in one kernel: each chunk's logits (of the compute dtype) are read
    twice and overwritten by their gradients (the student's by the KL's, the teacher's by the next-token one's)."""
    from t2r.ops.distill_rows import distill_rows

    n = hidden.shape[0]
    for start in range(0, n, chunk):
        rows = slice(start, min(start + chunk, n))
        h = hidden[rows].to(dtype)
        logits = h @ w.t()
        target = teacher[0][rows].to(teacher_dtype) @ teacher[1].t()
        row_kl, row_ce = distill_rows(logits, target, labels[rows] if labels is not None else None, t,
                                      kl_scale=t / max(kept, 1), ce_scale=1 / max(counted, 1),
                                      ignore_index=ignore_index)
        keep = None if mask is None else mask[rows]
        if keep is not None:
            logits[~keep] = 0
        kl_sum += (row_kl if keep is None else row_kl[keep]).sum().double()
        if labels is not None:
            ce_sum += row_ce.sum().double()
            add("ce", target, rows, h)
        add("kl", logits, rows, h)


def _chunks_plain(hidden, w, teacher, mask, labels, ignore_index, t, chunk, dtype, teacher_dtype, kept, counted, add,
                  kl_sum, ce_sum) -> None:
    """The chunk loop in PyTorch operations (any device and dtype; the reference of `_chunks_fused`)."""
    n = hidden.shape[0]
    # three fp32 [chunk, V] buffers at most: logits (then log q, then the gradient), the teacher's
    # (log p, then p) and log p - log q
    for start in range(0, n, chunk):
        rows = slice(start, min(start + chunk, n))
        h = hidden[rows].to(dtype)
        logits = (h @ w.t()).float()  # rounded to the compute dtype, as the model's lm_head gives them
        if labels is not None:  # the next-token loss at T = 1, while the logits are raw
            y = labels[rows]
            valid = y != ignore_index
            lse = logits.logsumexp(-1, keepdim=True)
            ce_sum -= (logits.gather(-1, y.clamp(min=0)[:, None]) - lse)[valid, 0].sum().double()
            g = logits.sub(lse).exp_()  # softmax - one-hot, over the counted labels
            g[valid.nonzero()[:, 0], y[valid]] -= 1
            g[~valid] = 0
            add("ce", g.div_(max(counted, 1)), rows, h)
            del g, lse
        log_q = _log_softmax_(logits, t)
        if isinstance(teacher, tuple):
            target = (teacher[0][rows].to(teacher_dtype) @ teacher[1].t()).float()
        else:
            target = teacher[rows].to(torch.float32, copy=True)
        log_p = _log_softmax_(target, t)
        difference = log_p - log_q
        p = log_p.exp_()
        row_kl = torch.linalg.vecdot(p, difference)  # F.kl_div's exp(log p) (log p - log q), summed
        del difference
        keep = None if mask is None else mask[rows]
        kl_sum += (row_kl if keep is None else row_kl[keep]).sum().double()
        # d (T^2 KL / N) / d logits = T (q - p) / N, zero on dropped tokens
        grad = log_q.exp_().sub_(p).mul_(t / max(kept, 1))
        del p, log_p, target
        if keep is not None:
            grad[~keep] = 0
        add("kl", grad, rows, h)
        del grad, log_q, logits
