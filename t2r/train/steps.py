"""The step loop every stage runs: micro-batches accumulated into optimizer steps, non-finite steps skipped,
metrics logged, checkpoints saved on schedule; the stage (`t2r.train.stages`) gives it the loss, optimizer and
schedule as a `Steps`."""

from __future__ import annotations

import math
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import torch

from . import checkpoint, logs, signals
from .errors import CollapseError, NonFiniteError
from .guard import CollapseGuard, NonFiniteGuard, weights_finite
from .recipe import save_resolved


@dataclass
class Steps:
    """One run of optimizer steps with one loss, optimizer and schedule: the whole training of a recipe without
    a stage list, or one stage of one. `loss(batch)` gives (loss, {part: value}); `lr_at(i)` the lr factor of
    this run's step i (0-based); the steps count from global step `first`."""

    total: int
    loss: Callable[[dict], tuple[torch.Tensor, dict]]
    optimizer: object
    params: list
    peak_lr: float
    lr_at: Callable[[int], float]
    batches: Iterable[dict]
    first: int = 0
    stage: str | None = None  # the stage's name: in rows, progress, checkpoint names and the trainer state
    lr_field: str = "train.lr"
    manual_grad_sync: bool = False  # average the gradients over processes here (a loss outside the model's forward)
    clock: object = None  # a `StartupClock` still open: closed, printed and written after this run's first step
    micro_tokens: int = 0  # the tokens of a full micro-batch: a shorter one (the data's last rows) is noted


def train_steps(recipe, accelerator, model, run: Steps, state: dict, history: list, callbacks) -> dict:
    """Train `run` from global step `state["step"]` to `run.first + run.total`, logging each step to
    metrics.jsonl and saving checkpoints every `checkpoint.every_steps` global steps and at the run's last
    step; `state` (step, tokens, skipped steps) is kept up to date. Returns the last step's metrics."""
    root, world = Path(recipe.checkpoint.dir), accelerator.num_processes
    accum, step, tokens = accelerator.gradient_accumulation_steps, state["step"], state["tokens"]
    guard = NonFiniteGuard(recipe.train.max_nonfinite_steps, hint=(
        f": lower {run.lr_field} (now {run.peak_lr}) and --resume, or check the data and the weights' dtype"))
    guard.total = state["skipped_steps"]
    record = state.setdefault("loss_watch", {}).setdefault(run.stage or "train", {})
    collapse = CollapseGuard(vocab_size(accelerator.unwrap_model(model)), recipe.train.max_collapsed_steps, record,
                             hint=f": lower {run.lr_field} (now {run.peak_lr}) and --overwrite, or --resume from an "
                                  "earlier checkpoint's state")
    collapsed = None
    end = run.first + run.total
    progress = logs.Progress(run.total, step - run.first, accelerator.is_main_process, recipe.logging.every_steps,
                             label=run.stage or "")
    model.train()
    window_loss, window_parts, window_tokens, window_start = 0.0, {}, 0, time.perf_counter()
    metrics = {"step": step, "tokens": tokens}
    clock = run.clock if run.clock is not None and run.clock.open else None
    batches = clock.timed_batches(run.batches) if clock is not None else run.batches
    for batch in batches:
        if step >= end:
            break
        if batch["input_ids"].numel() < run.micro_tokens:
            accelerator.print(f"note: step {step + 1}: a short micro-batch, {batch['input_ids'].numel():,} of "
                              f"{run.micro_tokens:,} tokens (the last rows of the data before it starts over); this "
                              f"step trains on fewer than train.tokens_per_step={recipe.train.tokens_per_step:,} "
                              "tokens")
        with accelerator.accumulate(model):
            loss, parts = run.loss(batch)
            accelerator.backward(loss)
            window_loss += loss.detach().float().item() / accum
            for name, value in parts.items():
                window_parts[name] = window_parts.get(name, 0.0) + value / accum
            window_tokens += batch["input_ids"].numel() * world
            if accelerator.sync_gradients:
                if world > 1:  # the mean over processes: every process then takes the same decision
                    means = torch.tensor([window_loss, *window_parts.values()], device=accelerator.device)
                    window_loss, *rest = accelerator.reduce(means, "mean").tolist()
                    window_parts = dict(zip(window_parts, rest))
                    if run.manual_grad_sync:
                        for p in run.params:
                            if p.grad is not None:
                                p.grad = accelerator.reduce(p.grad, "mean")
                grad_norm = float(accelerator.clip_grad_norm_(run.params, recipe.train.grad_clip or math.inf))
                lr = run.peak_lr * run.lr_at(step - run.first)
                update = guard.check(step + 1, window_loss, grad_norm)
                if math.isfinite(window_loss):
                    collapsed = collapse.check(step + 1, window_loss, window_parts.get("next_token"))
                if update or accelerator.scaler is not None:  # fp16: the loss scaler skips non-finite steps itself
                    for group in run.optimizer.param_groups:
                        group["lr"] = lr
                    run.optimizer.step()
            run.optimizer.zero_grad(set_to_none=True)
        if not accelerator.sync_gradients:
            continue
        if clock is not None:  # the first optimizer step: its compute (compilation included), then the line
            fetched = clock.parts.get("first batches", 0.0)
            clock.add("first step", time.perf_counter() - window_start - fetched)
            clock.done()
            accelerator.print(clock.line())
            if accelerator.is_main_process:
                clock.write(root)
            clock = None
        step += 1
        tokens += window_tokens
        elapsed = time.perf_counter() - window_start
        metrics = {"step": step, "tokens": tokens, "loss": logs.finite_or_none(window_loss), "lr": lr,
                   "grad_norm": logs.finite_or_none(grad_norm), "tokens_per_s": window_tokens / max(elapsed, 1e-9)}
        if run.stage is not None:
            metrics.update(stage=run.stage, stage_step=step - run.first,
                           **{f"loss_{name}": logs.finite_or_none(value) for name, value in window_parts.items()})
        if not update:
            metrics["skipped"] = True
        window_loss, window_parts, window_tokens, window_start = 0.0, {}, 0, time.perf_counter()
        progress.step({**metrics, "step": step - run.first})
        if accelerator.is_main_process:
            history.append(metrics)
            logs.append_jsonl(root / "metrics.jsonl", metrics)
        if step % recipe.logging.every_steps == 0 and recipe.logging.trackers:
            accelerator.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=step)
        state.update(step=step, tokens=tokens, skipped_steps=guard.total)
        if run.stage is not None:
            state["stage_step"] = step - run.first
        saved = None
        if (step % recipe.checkpoint.every_steps == 0 or step == end) and collapsed:
            if step == end:
                raise CollapseError(f"step {step}: {collapsed}: the run ended on a collapsed step, so it was not saved "
                                    f"and no final model was written; the newest checkpoint in {root} holds the last "
                                    f"good weights: lower {run.lr_field} (now {run.peak_lr}) and --overwrite")
            accelerator.print(f"step {step}: {collapsed}; the checkpoint is not written while the loss looks "
                              "collapsed (the newest one holds the last good weights)")
        elif step % recipe.checkpoint.every_steps == 0 or step == end:
            saved = _save(recipe, accelerator, model, run, state, step)
        for callback in callbacks:
            callback(metrics)
        signum = _signal_on_any_process(accelerator, signals.active())
        if signum:
            if collapsed:
                where = f"this collapsed step was not saved; the newest checkpoint in {root} holds the last good one"
            else:
                where = f"checkpoint {(saved or _save(recipe, accelerator, model, run, state, step)).name} written"
            raise signals.Stopped(f"stopped by {signal.Signals(signum).name} after step {step}: {where}; --resume "
                                  "continues the run", signum)
    progress.close()
    return metrics


def _save(recipe, accelerator, model, run: Steps, state: dict, step: int) -> Path:
    root = Path(recipe.checkpoint.dir)
    require_finite(model, accelerator, step, root)
    position = getattr(run.batches, "position", None)  # where the data stream stands: a resume starts there
    if position is not None and run.micro_tokens:
        state["data_position"] = position(step * recipe.train.tokens_per_step // run.micro_tokens)
    return checkpoint.save(accelerator, root, dict(state), write_extra=lambda d: save_resolved(recipe, d),
                           keep_last=max(1, recipe.checkpoint.keep_last),  # 0: the newest until final/ is written
                           label=run.stage)


def _signal_on_any_process(accelerator, stop) -> int | None:
    """The stop signal this process received; with several processes, any one's (all then stop at the same step)."""
    signum = stop.signum if stop is not None else None
    if accelerator.num_processes == 1:
        return signum
    flag = accelerator.reduce(torch.tensor(float(signum or 0), device=accelerator.device), "sum").item()
    return signum or (int(signal.SIGTERM) if flag else None)


def vocab_size(model) -> int:
    """The size of the vocabulary the model predicts over."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return int(config.vocab_size)


def require_finite(model, accelerator, step: int, root: Path) -> None:
    if not weights_finite(model, accelerator):
        raise NonFiniteError(f"step {step}: the weights are no longer finite, so they were not saved; the checkpoints "
                             f"in {root} hold the last finite ones (lower train.lr, then --resume or --overwrite)")
