"""Per-token distillation losses and their logit gradients in two passes over the vocabulary (Triton).

For each row (a token) with student logits s and teacher logits u over V entries, at temperature T:

    log q = log_softmax(s / T),  log p = log_softmax(u / T),   kl = sum_v p_v (log p_v - log q_v)
    d kl / d s = (q - p) / T                      (scaled by the caller: T^2 / N gives T (q - p) / N)
    ce = logsumexp(s) - s_y,   d ce / d s = softmax(s) - onehot(y)     (T = 1; y = ignore_index: 0)

`distill_rows` writes the two gradients over the logits it was given (the student's buffer takes the KL
gradient, the teacher's the next-token one), so one chunk of a fused distillation (`t2r.train.kl`) reads each
logit twice and writes it once, in bf16, instead of ~30 fp32 passes of separate PyTorch operations (88 ms of a
16K-token micro-batch's 367 on an H100, `benchmarks/results/profile_distill_*.md`). `distill_rows_reference`
is the same in PyTorch, the ground truth of the tests.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import triton_utils  # noqa: F401 - patches Triton's CPU interpreter for NumPy >= 2.4

BLOCK_V = 2048


@triton.jit
def _online_lse(m, l, x):
    """One block of x into per-lane running maxima m and sums l of exp(x - m) (lanes that saw only -inf: 0)."""
    m_new = tl.maximum(m, x)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    return m_new, l * tl.exp(m - m_safe) + tl.exp(x - m_safe)


@triton.jit
def _lse(m, l):
    """logsumexp over the lanes of `_online_lse`'s state."""
    big = tl.max(m, 0)
    return big + tl.log(tl.sum(l * tl.exp(m - big), 0))


@triton.jit
def _distill_rows_kernel(S, U, Y, ROW_KL, ROW_CE, V, stride, inv_t, kl_scale, ce_scale, ignore_index,
                         HAS_LABELS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    s_row, u_row = S + row * stride, U + row * stride
    offs = tl.arange(0, BLOCK)
    # pass 1: running max and sum of exp for s / T, u / T and (for the next-token loss) s
    m_q = tl.full([BLOCK], float("-inf"), tl.float32)
    l_q = tl.zeros([BLOCK], tl.float32)
    m_p = tl.full([BLOCK], float("-inf"), tl.float32)
    l_p = tl.zeros([BLOCK], tl.float32)
    m_c = tl.full([BLOCK], float("-inf"), tl.float32)
    l_c = tl.zeros([BLOCK], tl.float32)
    for start in range(0, V, BLOCK):
        cols = start + offs
        ok = cols < V
        s = tl.load(s_row + cols, mask=ok, other=float("-inf")).to(tl.float32)
        u = tl.load(u_row + cols, mask=ok, other=float("-inf")).to(tl.float32)
        m_q, l_q = _online_lse(m_q, l_q, s * inv_t)
        m_p, l_p = _online_lse(m_p, l_p, u * inv_t)
        if HAS_LABELS:
            m_c, l_c = _online_lse(m_c, l_c, s)
    lse_q = _lse(m_q, l_q)
    lse_p = _lse(m_p, l_p)
    lse_c = 0.0
    y = -1
    if HAS_LABELS:
        lse_c = _lse(m_c, l_c)
        y = tl.load(Y + row).to(tl.int32)
        valid = y != ignore_index
        s_y = tl.load(s_row + tl.where(valid, y, 0)).to(tl.float32)
        tl.store(ROW_CE + row, tl.where(valid, lse_c - s_y, 0.0))
        y = tl.where(valid, y, -1)
        ce_row_scale = tl.where(valid, ce_scale, 0.0)
    # pass 2: KL, and the gradients written over the logits they came from
    kl = tl.zeros([BLOCK], tl.float32)
    for start in range(0, V, BLOCK):
        cols = start + offs
        ok = cols < V
        s = tl.load(s_row + cols, mask=ok, other=0.0).to(tl.float32)
        u = tl.load(u_row + cols, mask=ok, other=0.0).to(tl.float32)
        log_q = s * inv_t - lse_q
        log_p = u * inv_t - lse_p
        p = tl.exp(log_p)
        kl += tl.where(ok & (p > 0), p * (log_p - log_q), 0.0)
        tl.store(s_row + cols, ((tl.exp(log_q) - p) * kl_scale).to(S.dtype.element_ty), mask=ok)
        if HAS_LABELS:
            grad = tl.exp(s - lse_c) - tl.where(cols == y, 1.0, 0.0)
            tl.store(u_row + cols, (grad * ce_row_scale).to(U.dtype.element_ty), mask=ok)
    tl.store(ROW_KL + row, tl.sum(kl, 0))


def distill_rows(student: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor | None, temperature: float,
                 kl_scale: float, ce_scale: float, ignore_index: int = -100):
    """student, teacher `[R, V]` logits (one dtype, contiguous rows): returns (row_kl `[R]`, row_ce `[R]` or None,
    fp32) and overwrites `student` with `kl_scale * (q - p)` and, with `labels` `[R]`, `teacher` with
    `ce_scale * (softmax(student) - onehot)` (zero rows where the label is `ignore_index`)."""
    rows, vocab = student.shape
    row_kl = torch.empty(rows, dtype=torch.float32, device=student.device)
    row_ce = torch.empty(rows, dtype=torch.float32, device=student.device) if labels is not None else row_kl
    _distill_rows_kernel[(rows,)](student, teacher, labels if labels is not None else row_kl, row_kl, row_ce, vocab,
                                  student.stride(0), 1.0 / temperature, float(kl_scale), float(ce_scale),
                                  int(ignore_index), HAS_LABELS=labels is not None, BLOCK=BLOCK_V, num_warps=8)
    return row_kl, (row_ce if labels is not None else None)


def distill_rows_reference(student: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor | None,
                           temperature: float, kl_scale: float, ce_scale: float, ignore_index: int = -100):
    """`distill_rows` in PyTorch (fp32 math), the same in-place contract."""
    s, u = student.float(), teacher.float()
    log_q, log_p = torch.log_softmax(s / temperature, -1), torch.log_softmax(u / temperature, -1)
    p = log_p.exp()
    row_kl = torch.where(p > 0, p * (log_p - log_q), 0.0).sum(-1)
    row_ce = None
    if labels is not None:
        valid = labels != ignore_index
        lse = s.logsumexp(-1)
        row_ce = torch.where(valid, lse - s.gather(-1, labels.clamp(min=0)[:, None])[:, 0], 0.0)
        grad = (s - lse[:, None]).exp()
        grad[valid.nonzero()[:, 0], labels[valid]] -= 1
        teacher.copy_(grad * ce_scale * valid[:, None])
    student.copy_((log_q.exp() - p) * kl_scale)
    return row_kl, row_ce
