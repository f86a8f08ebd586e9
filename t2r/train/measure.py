"""`--dry-run --measure N`: a short timed run of the recipe on this machine, for the plan's time and memory.

The recipe's model is built, converted and made trainable exactly as `finetune` does (`build_model`), then
trained for `warmup + N` optimizer steps of one micro-batch each, on the recipe's own data, in this process:
no checkpoint, no run directory, nothing written. The median step after the warm-up gives tokens/s (per
process); peak memory is CUDA's `max_memory_allocated` or, on CPU, the growth of the process's peak resident
memory over what it held before the model loaded. The stage timed is the first with a KL loss (the teacher's
forward makes it the heaviest), else the last; an attention-MSE part is not timed (it is short and lighter).
"""

from __future__ import annotations

import resource
import statistics
import time
from dataclasses import dataclass, replace
from functools import partial
from itertools import islice

import torch

GiB = 2**30


@dataclass
class Measured:
    tokens_per_second: float
    step_seconds: float
    peak_bytes: int
    device: str
    steps: int


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def measure_throughput(recipe, steps: int = 3, warmup: int = 1) -> Measured:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    from t2r.optim import build_optimizer

    from .batches import micro_batches, packed_loader
    from .losses import stage_loss
    from .model_setup import build_model, place_teacher

    if steps < 1:
        raise ValueError(f"--measure {steps}: give at least 1 timed step")
    cuda = torch.cuda.is_available()
    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=not cuda, mixed_precision=recipe.train.mixed_precision)
    before = _peak_rss()
    model, tokenizer, teacher = build_model(recipe)
    train = recipe.train
    optimizer = build_optimizer([p for p in model.parameters() if p.requires_grad], train.lr, train,
                                device=accelerator.device)
    model, optimizer = accelerator.prepare(model, optimizer)
    if teacher is not None:
        place_teacher(teacher, accelerator.device)
    model.train()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    batches = micro_batches(partial(packed_loader, recipe, tokenizer, "train"),
                            accelerator.device)
    stages = recipe.stage_list
    stage = next((s for s in stages if s.loss.get("kl")), stages[-1])
    loss_weights = {name: w for name, w in stage.loss.items() if name != "attention_mse" and w}
    loss = stage_loss(model, teacher, None, replace(stage, loss=loss_weights or {"next_token": 1.0}),
                      accelerator.autocast)
    times = []
    for batch in islice(batches, warmup + steps):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        accelerator.backward(loss(batch)[0])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    if len(times) < warmup + steps:
        raise ValueError(f"--measure: the training data gave {len(times)} micro-batches, fewer than {warmup + steps}")
    seconds = statistics.median(times[warmup:])
    tokens = train.micro_batch_size * recipe.data.seq_len
    peak = torch.cuda.max_memory_allocated() if cuda else _peak_rss() - before
    return Measured(tokens / seconds, seconds, peak, torch.cuda.get_device_name() if cuda else "cpu", steps)


def format_measured(measured: Measured, planned_gib: float) -> str:
    return (f"# measured on {measured.device} (1 process, median of {measured.steps} steps after warm-up): "
            f"{measured.step_seconds:.3g} s per micro-batch, {measured.tokens_per_second:,.0f} tokens/s; peak "
            f"memory {measured.peak_bytes / GiB:.2f} GiB against the plan's {planned_gib:.2f} GiB for 1 GPU")
