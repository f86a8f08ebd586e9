"""Training throughput of causal LMs (a converted model and its source) over a sweep of contexts.

One loop for every model, as `t2r finetune` trains under mixed precision: fp32 weights, bf16 autocast on CUDA
(fp32 on CPU), AdamW over every parameter (fused on CUDA), forward with labels, backward, step. Each context
runs `tokens_per_step` tokens per step as rows of `context` tokens, so the rows of a sweep do the same work
per step and tokens/s compare across contexts. Random ids (speed does not depend on their values). The
median step after `warmup` steps (Triton compiles, allocator) gives tokens/s; peak memory is CUDA's
`max_memory_allocated` (weights, gradients and optimizer states included). On CPU it is not reported: the
growth of resident memory counts the optimizer states in the first cell of a process and the allocator's
reuse in the next ones (measured: 5.6 GiB for the first cell, 0.5 GiB for the same work later), so
cells would not compare; `benchmarks/cpu_memory.py` measures each model in a process of its own.
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from tqdm.auto import tqdm

from t2r.eval.axes import legend, log_axis, spread, style, tokens_text
from t2r.eval.bench import MiB, failure_status, random_ids
from t2r.optim import build_optimizer


def rows_per_step(tokens_per_step: int, context: int) -> int:
    """Rows of `context` tokens in a step of `tokens_per_step` tokens (at least one)."""
    return max(1, tokens_per_step // context)


@dataclass
class TrainRow:
    """One (model, context) cell of a training sweep; the measurements are None unless `status` is "ok"."""

    model: str
    context: int
    batch: int
    """Rows of `context` tokens per step (`rows_per_step`)."""
    tokens_per_s: float | None = None
    step_ms: float | None = None
    """Median milliseconds of one optimizer step (forward, backward, update)."""
    peak_memory_bytes: int | None = None
    status: str = "ok"
    """"ok" | "OOM" | "error: <message>"."""


def next_token_loss(model, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, labels=ids, use_cache=False).loss


def training_steps(model, context: int, tokens_per_step: int, warmup: int = 1, steps: int = 3, seed: int = 0,
                   check_first: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
                   loss_fn: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor] = next_token_loss,
                   ) -> tuple[float, int, int | None]:
    """(median ms per step, tokens per step, CUDA peak bytes or None on CPU) of `warmup + steps` training
    steps on random ids. `check_first(ids, loss)` sees the first step's batch and loss (a compiled model checks itself
    there); `loss_fn(model, ids)` is the step's loss (default the next-token loss; a distillation bench passes
    one with a teacher). The model's parameters are updated: time a copy if the weights matter afterwards."""
    if steps < 1 or warmup < 0:
        raise ValueError(f"steps={steps}, warmup={warmup}: need at least one timed step and no negative warm-up")
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    ids = random_ids(model.config.vocab_size, rows_per_step(tokens_per_step, context), context, seed, device)
    model.train()
    optimizer = build_optimizer([p for p in model.parameters() if p.requires_grad], 1e-5, device=device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda)
    times = []
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    try:
        for i in range(warmup + steps):
            if cuda:
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            with autocast:
                loss = loss_fn(model, ids)
            if i == 0 and check_first is not None:
                check_first(ids, loss)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize(device)
            if i >= warmup:
                times.append((time.perf_counter() - start) * 1e3)
    finally:
        optimizer.zero_grad(set_to_none=True)
        del optimizer  # its states hold twice the trainable weights
        model.eval()
    peak = torch.cuda.max_memory_allocated(device) if cuda else None
    return statistics.median(times), ids.numel(), peak


def bench_training(model, label: str, contexts, tokens_per_step: int | None = None, warmup: int = 1,
                   steps: int = 3, seed: int = 0) -> list[TrainRow]:
    """Training tokens/s, step time and peak memory at each context (`training_steps`); `tokens_per_step`
    defaults to the largest context (one row there). An OOM or error gives a row with that status and the
    sweep goes on. The model's weights change: measure models loaded for the purpose."""
    tokens_per_step = tokens_per_step or max(contexts)
    device = next(model.parameters()).device
    rows = []
    for context in tqdm(contexts, desc=f"train bench {label}", disable=None):
        row = TrainRow(label, int(context), rows_per_step(tokens_per_step, context))
        rows.append(row)
        try:
            row.step_ms, tokens, row.peak_memory_bytes = training_steps(model, context, tokens_per_step, warmup,
                                                                        steps, seed)
            row.tokens_per_s = tokens / row.step_ms * 1e3
        except Exception as error:  # one failing cell must not end the sweep
            rows[-1] = TrainRow(label, row.context, row.batch, status=failure_status(error))
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def format_train_table(rows: list[TrainRow], reference: str | None = None) -> str:
    """Markdown table, one line per (model, context): tokens/s, step ms, peak MiB and, with `reference` (a
    model label, e.g. the source's), each row's tokens/s over the reference's at the same context."""
    base = {r.context: r.tokens_per_s for r in rows if r.model == reference and r.status == "ok"}
    ratio_header = [f"x {reference}"] if reference else []
    header = ["model", "context", "batch", "tokens/s", *ratio_header, "step ms", "peak MiB"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        if row.status != "ok":
            values = [row.status] + ["-"] * (len(header) - 4)
        else:
            ratio = [f"{row.tokens_per_s / base[row.context]:.2f}" if row.context in base else "-"] if reference else []
            peak = "n/a" if row.peak_memory_bytes is None else f"{row.peak_memory_bytes / MiB:,.0f}"
            values = [f"{row.tokens_per_s:,.0f}", *ratio, f"{row.step_ms:,.1f}", peak]
        lines.append("| " + " | ".join([row.model, str(row.context), str(row.batch), *values]) + " |")
    return "\n".join(lines)


def plot_training(rows: list[TrainRow], out_dir) -> list[Path]:
    """Write train_vs_context.png (training tokens/s, and peak MiB where measured: CUDA, against context; one
    series per model, each its own colour, marker and dashes); returns its path in a list, as `bench.plot` does."""
    from matplotlib.figure import Figure

    ok = [r for r in rows if r.status == "ok"]
    panels = [("tokens_per_s", 1, "training tokens/s")] + (
        [("peak_memory_bytes", MiB, "peak MiB (CUDA)")] if any(r.peak_memory_bytes is not None for r in ok) else [])
    models = list(dict.fromkeys(r.model for r in ok))
    contexts = sorted({r.context for r in ok})
    fig = Figure(figsize=(6 * len(panels), 4), layout="constrained")
    for ax, (attr, scale, ylabel) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
        for m, model in enumerate(models):
            points = sorted((r.context, getattr(r, attr) / scale) for r in ok
                            if r.model == model and getattr(r, attr) is not None)
            if points:
                xs, ys = zip(*points)
                ax.plot(spread(xs, m, len(models)), ys, **style(m), label=model)
        if contexts:
            log_axis(ax.xaxis, contexts, tokens_text, ticks=contexts)
        ax.set(xlabel="context (tokens)", ylabel=ylabel)
        ax.grid(True, which="major", alpha=0.3)
        legend(ax, fontsize="small")
    path = Path(out_dir) / "train_vs_context.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return [path]
