"""The step loop every stage runs: micro-batches accumulated into optimizer steps, non-finite steps skipped,
metrics logged, checkpoints saved on schedule; the stage (`t2r.train.stages`) gives it the loss, optimizer and
schedule as a `Steps`."""

from __future__ import annotations

import math
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import torch

from t2r.models.compilation import cache_outcomes

from . import checkpoint, logs, signals
from .collector import StepCollector
from .errors import CollapseError, NonFiniteError
from .gradient_sync import average_gradients
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
    micro_tokens: int = 0  # the tokens of a micro-batch (where the stream stands is counted in micro-batches)


@dataclass
class Window:
    """What the micro-batches of one optimizer step add up to: the loss and its parts (each micro-batch's divided
    by the accumulation), the tokens of every process, and when the step began. The sums stay on the device
    until `read` (once a step): a read-back per micro-batch would stop the host from queueing the next one's
    kernels while the GPU runs this one's."""

    loss: float | torch.Tensor = 0.0
    parts: dict = field(default_factory=dict)
    tokens: int = 0
    start: float = field(default_factory=time.perf_counter)
    grad_norm: float = math.nan
    any_stop: bool = False  # a stop signal had come to some process by the read

    def add(self, loss: torch.Tensor, parts: dict, tokens: int, accum: int) -> None:
        self.loss = self.loss + loss.detach().float() / accum
        for name, value in parts.items():
            self.parts[name] = self.parts.get(name, 0.0) + value / accum
        self.tokens += tokens

    def read(self, accelerator, grad_norm: float | torch.Tensor = math.nan, stop: bool = False) -> None:
        """The loss, its parts and the gradient norm (the same on every process) as floats, averaged over
        processes, and whether any process had a stop signal (`stop`, this one's): one transfer from the device
        and, with several processes, one all-reduce, the step's only point where the host waits for the device
        and the processes wait for each other (a DDP step had three: the loss, the norm, the stop signal)."""
        if hasattr(grad_norm, "full_tensor"):  # FSDP2's norm is a DTensor
            grad_norm = grad_norm.full_tensor()
        values = torch.stack([torch.as_tensor(v, dtype=torch.float32, device=accelerator.device).reshape(())
                              for v in (self.loss, grad_norm, float(stop), *self.parts.values())])
        if accelerator.num_processes > 1:
            values = accelerator.reduce(values, "mean")
        self.loss, self.grad_norm, stopped, *rest = values.tolist()
        self.any_stop = stopped > 0
        self.parts = dict(zip(self.parts, rest))


@dataclass
class Update:
    """An optimizer step's outcome: whether the weights changed, at which lr, the gradient norm before clipping."""

    applied: bool
    lr: float
    grad_norm: float


def train_steps(recipe, accelerator, model, run: Steps, state: dict, history: list, callbacks) -> dict:
    """Train `run` from global step `state["step"]` to `run.first + run.total`, logging each step to
    metrics.jsonl and saving checkpoints every `checkpoint.every_steps` global steps and at the run's last
    step; `state` (step, tokens, skipped steps) is kept up to date. Returns the last step's metrics."""
    loop = StepLoop(recipe, accelerator, model, run, state, history, callbacks)
    model.train()
    metrics = {"step": state["step"], "tokens": state["tokens"]}
    collector = StepCollector(recipe.train.collect_garbage)
    try:
        with collector:
            for batch in loop.batches:
                if loop.step >= loop.end:
                    break
                with accelerator.accumulate(model):
                    loss, parts = run.loss(batch)
                    accelerator.backward(loss)
                    loop.window.add(loss, parts, batch["input_ids"].numel() * accelerator.num_processes,
                                    accelerator.gradient_accumulation_steps)
                    if accelerator.sync_gradients:
                        collector.step_done(loop.step + 1)  # while the GPU runs the backward just queued
                        update = loop.optimizer_step()
                    run.optimizer.zero_grad(set_to_none=True)
                if accelerator.sync_gradients:
                    metrics = loop.after_step(update)
    finally:  # also when a signal, an error or a callback stops the run: a reader process left running (it
        # ignores SIGTERM) kept the stopped process from exiting, joined by multiprocessing at exit
        loop.progress.close()
        if hasattr(run.batches, "close"):
            run.batches.close()
    return metrics


class StepLoop:
    """The step loop of one `Steps` run: `optimizer_step` once its micro-batches are accumulated, then
    `after_step`: the step's metrics logged, its checkpoint, the callbacks and a stop signal."""

    def __init__(self, recipe, accelerator, model, run: Steps, state: dict, history: list, callbacks):
        self.recipe, self.accelerator, self.model, self.run = recipe, accelerator, model, run
        self.state, self.history, self.callbacks = state, history, callbacks
        self.root = Path(recipe.checkpoint.dir)
        self.step, self.tokens, self.end = state["step"], state["tokens"], run.first + run.total
        self.guard = NonFiniteGuard(recipe.train.max_nonfinite_steps, hint=(
            f": lower {run.lr_field} (now {run.peak_lr}) and --resume, or check the data and the weights' dtype"))
        self.guard.total = state["skipped_steps"]
        record = state.setdefault("loss_watch", {}).setdefault(run.stage or "train", {})
        self.collapse = CollapseGuard(vocab_size(accelerator.unwrap_model(model)), recipe.train.max_collapsed_steps,
                                      record, hint=f": lower {run.lr_field} (now {run.peak_lr}) and --overwrite, or "
                                                   "--resume from an earlier checkpoint's state")
        self.collapsed = None  # why the last finite step looked collapsed
        self.progress = logs.Progress(run.total, self.step - run.first, accelerator.is_main_process,
                                      recipe.logging.every_steps, label=run.stage or "")
        self.clock = run.clock if run.clock is not None and run.clock.open else None
        self.batches = self.clock.timed_batches(run.batches) if self.clock is not None else run.batches
        self.window = Window()  # the step being accumulated
        self.any_stop = False  # whether some process had a stop signal by this step's read

    def optimizer_step(self) -> Update:
        """The accumulated gradients into one update: the loss averaged over processes (every process then takes
        the same decision), clipped, the step skipped when not finite (`NonFiniteGuard`), a collapse watched."""
        accelerator, run, window = self.accelerator, self.run, self.window
        if accelerator.num_processes > 1 and run.manual_grad_sync:
            average_gradients(accelerator, run.params, self.recipe.train.gradient_sync)
        norm = accelerator.clip_grad_norm_(run.params, self.recipe.train.grad_clip or math.inf)  # on the device
        window.read(accelerator, norm, stop=_signal(signals.active()) is not None)
        self.any_stop = window.any_stop
        grad_norm = window.grad_norm
        lr = run.peak_lr * run.lr_at(self.step - run.first)
        applied = self.guard.check(self.step + 1, window.loss, grad_norm)
        if math.isfinite(window.loss):
            self.collapsed = self.collapse.check(self.step + 1, window.loss, window.parts.get("next_token"))
        if applied or accelerator.scaler is not None:  # fp16: the loss scaler skips non-finite steps itself
            for group in run.optimizer.param_groups:
                group["lr"] = lr
            run.optimizer.step()
        return Update(applied, lr, grad_norm)

    def after_step(self, update: Update) -> dict:
        """What follows an optimizer step: the start-up line after the first, the step's metrics (progress,
        metrics.jsonl, trackers, `state`), its checkpoint, the callbacks, a stop signal. Returns the metrics."""
        window = self.window
        if self.clock is None and self.step == self.run.first and self.recipe.train.compile:
            # a later stage's first step (the first stage's is on the start-up line): its graphs compiled or loaded
            self.accelerator.print(f"{self.run.stage or 'training'}: first step "
                                   f"{time.perf_counter() - window.start:.1f} s, {_compiled()}")
        self.close_clock(window)
        self.step += 1
        self.tokens += window.tokens
        metrics = self.metrics(window, update)
        self.window = Window()  # the next step's time runs from here
        self.log(metrics)
        self.state.update(step=self.step, tokens=self.tokens, skipped_steps=self.guard.total,
                          skipped_in_row=self.guard.in_row)
        if self.run.stage is not None:
            self.state["stage_step"] = self.step - self.run.first
        saved = self.checkpoint()
        for callback in self.callbacks:
            callback(metrics)
        self.stop_on_signal(saved)
        return metrics

    def close_clock(self, window: Window) -> None:
        """After the first optimizer step: its compute (compilation included) on the start-up clock, then the line."""
        clock = self.clock
        if clock is None:
            return
        fetched = clock.parts.get("first batches", 0.0)
        clock.add("first step", time.perf_counter() - window.start - fetched)
        clock.done()
        self.accelerator.print(clock.line())
        if self.recipe.train.compile:  # why a first step took long: graphs compiled, or loaded from the caches
            self.accelerator.print(f"first step: {_compiled()}")
        if self.accelerator.is_main_process:
            clock.write(self.root)
        self.clock = None

    def metrics(self, window: Window, update: Update) -> dict:
        """The step's row of metrics.jsonl."""
        run, step = self.run, self.step
        elapsed = time.perf_counter() - window.start
        metrics = {"step": step, "tokens": self.tokens, "loss": logs.finite_or_none(window.loss), "lr": update.lr,
                   "grad_norm": logs.finite_or_none(update.grad_norm),
                   "tokens_per_s": window.tokens / max(elapsed, 1e-9)}
        if run.stage is not None:
            metrics.update(stage=run.stage, stage_step=step - run.first,
                           **{f"loss_{name}": logs.finite_or_none(value) for name, value in window.parts.items()})
        if not update.applied:
            metrics["skipped"] = True
        if self.recipe.train.compile:  # graphs dynamo has compiled in this process: flat once the shapes are known
            metrics["compiled_graphs"] = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        device = self.accelerator.device
        if device.type == "cuda":  # this process's card: the peak since the run began (weights included)
            metrics["gpu_peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        return metrics

    def log(self, metrics: dict) -> None:
        """The progress line, the history and metrics.jsonl (main process), the trackers (every logging step)."""
        self.progress.step({**metrics, "step": self.step - self.run.first})
        if self.accelerator.is_main_process:
            self.history.append(metrics)
            logs.append_jsonl(self.root / "metrics.jsonl", metrics)
        if self.step % self.recipe.logging.every_steps == 0 and self.recipe.logging.trackers:
            self.accelerator.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=self.step)

    def checkpoint(self) -> Path | None:
        """The checkpoint due at this step (every `checkpoint.every_steps`, and the run's last), unless the step
        looks collapsed: then none (a collapsed last step ends the run). Returns the checkpoint written."""
        step, root = self.step, self.root
        if not (step % self.recipe.checkpoint.every_steps == 0 or step == self.end):
            return None
        if not self.collapsed:
            return _save(self.recipe, self.accelerator, self.model, self.run, self.state, step)
        if step == self.end:
            raise CollapseError(f"step {step}: {self.collapsed}: the run ended on a collapsed step, so it was not "
                                f"saved and no final model was written; the newest checkpoint in {root} holds the "
                                f"last good weights: lower {self.run.lr_field} (now {self.run.peak_lr}) and "
                                "--overwrite")
        self.accelerator.print(f"step {step}: {self.collapsed}; the checkpoint is not written while the loss looks "
                               "collapsed (the newest one holds the last good weights)")
        return None

    def stop_on_signal(self, saved: Path | None) -> None:
        """`signals.Stopped` when a stop signal came to any process: after a checkpoint of this step (`saved`, or
        one written now), unless the step looks collapsed."""
        signum = _signal(signals.active())
        if self.accelerator.num_processes > 1:  # what the step's read agreed: every process stops after one step
            signum = (signum or int(signal.SIGTERM)) if self.any_stop else None
        if not signum:
            return
        if self.collapsed:
            where = f"this collapsed step was not saved; the newest checkpoint in {self.root} holds the last good one"
        else:
            saved = saved or _save(self.recipe, self.accelerator, self.model, self.run, self.state, self.step)
            where = f"checkpoint {saved.name} written"
        raise signals.Stopped(f"stopped by {signal.Signals(signum).name} after step {self.step}: {where}; --resume "
                              "continues the run", signum)


def _save(recipe, accelerator, model, run: Steps, state: dict, step: int) -> Path:
    root = Path(recipe.checkpoint.dir)
    require_finite(model, accelerator, step, root)
    position = getattr(run.batches, "position", None)  # where the data stream stands: a resume starts there
    if position is not None and run.micro_tokens:
        state["data_position"] = position(step * recipe.train.tokens_per_step // run.micro_tokens)
    return checkpoint.save(accelerator, root, dict(state), write_extra=lambda d: save_resolved(recipe, d),
                           keep_last=max(1, recipe.checkpoint.keep_last),  # 0: the newest until final/ is written
                           label=run.stage)


def _compiled() -> str:
    """How many graphs this process has compiled so far, and what torch.compile's caches gave it."""
    caches = cache_outcomes()
    return f"compiled graphs by now {torch._dynamo.utils.counters['stats']['unique_graphs']}" + (
        f" ({caches})" if caches else "")


def _signal(stop) -> int | None:
    """The stop signal this process received, if any. With several processes the step's read (`Window.read`)
    says whether any had one by then, and all stop after that step; a signal that comes to one process after
    the read stops the run after the next step."""
    return stop.signum if stop is not None else None


def vocab_size(model) -> int:
    """The size of the vocabulary the model predicts over."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return int(config.vocab_size)


def require_finite(model, accelerator, step: int, root: Path) -> None:
    if not weights_finite(model, accelerator):
        raise NonFiniteError(f"step {step}: the weights are no longer finite, so they were not saved; the checkpoints "
                             f"in {root} hold the last finite ones (lower train.lr, then --resume or --overwrite)")
