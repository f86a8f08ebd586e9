"""The finetuning loop: one code path for one GPU, DDP and FSDP (accelerate carries the
distribution, mixed precision and gradient accumulation), exact resume from verified atomic checkpoints.

A run locks its checkpoint directory, checks its data before the model loads, starts afresh only in a
directory it may claim (`resume.choose_start`), skips optimizer steps whose loss or gradient norm is not
finite (`guard`), and never saves non-finite weights. A recipe with a stage list runs each stage through the same
step loop (`train_steps`; the stages themselves: `t2r.train.stages`)."""

from __future__ import annotations

import itertools
import json
import math
import time
from dataclasses import dataclass
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from t2r.data import PackedSequences, collate_packed, load_documents
from t2r.data.check import check_files, check_rows
from t2r.outputs import quiet_libraries
from t2r.sources import load_tokenizer

from . import checkpoint, logs
from .errors import NonFiniteError
from .export import save_final
from .guard import NonFiniteGuard, weights_finite
from .model_setup import build_model, from_main_process, place_teacher, trainable_parameters
from .recipe import save_resolved
from .resume import choose_start
from .run_dir import RunLock
from .schedule import lr_factor
from .stages import train_stages
from .transfer import attention_transfer


class Interrupt(Exception):
    """Raised by a callback to stop training after a step (the last checkpoint stays valid)."""


def packed_loader(recipe, tokenizer, part: str = "train", epoch: int = 0) -> DataLoader:
    """Micro-batches of packed rows, flattened into one sequence with document boundaries. Each
    epoch shuffles the documents with its own seed (the held-out split depends on the base seed only)."""
    cfg = recipe.data.data_config()
    seed = recipe.train.seed + epoch
    rows = PackedSequences(lambda: load_documents(cfg, seed, part), tokenizer, recipe.data.seq_len)
    collate = partial(collate_packed, document_boundaries=recipe.data.document_boundaries)
    return DataLoader(rows, batch_size=recipe.train.micro_batch_size, collate_fn=collate)


def micro_batches(make_loader: Callable[[int], Iterable[dict]], device, rank: int = 0, world: int = 1,
                  skip: int = 0, epochs: int | None = None):
    """This process's micro-batches on `device`: every `world`-th of one deterministic stream of
    epochs (`make_loader(epoch)`, repeated until `epochs`, or forever), after the first `skip` (global)
    ones, which a resumed run has already trained on. (The stream is sharded here, not by accelerate's
    loader wrapper, which slices the flattened batch's `cu_seq_lens` as if they were per-example.)"""
    index = 0
    for epoch in itertools.count() if epochs is None else range(epochs):
        start = index
        for batch in make_loader(epoch):
            if index >= skip and index % world == rank:
                yield {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
            index += 1
        if index == start:
            if epoch == 0 and epochs is None:
                raise ValueError("the training data gave no full sequence: check data.path, data.text_field "
                                 "and data.held_out, or lower data.seq_len")
            return


def step_loss(model, batch: dict, teacher=None, distill=None) -> torch.Tensor:
    """Next-token loss; with a teacher, (1 - w) * next-token + w * T^2 * KL(teacher || student)
    on temperature-softened distributions (Hinton et al. 2015)."""
    out = model(**batch)
    if teacher is None:
        return out.loss
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        target = teacher(**inputs).logits.float()
    t = distill.temperature
    return (1 - distill.weight) * out.loss + distill.weight * t * t * distill_kl(out.logits, target, t)


def distill_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(teacher || student) per token on temperature-softened distributions (without the T^2 factor)."""
    t = temperature
    student = F.log_softmax(student_logits.float().flatten(0, -2) / t, -1)
    target = F.log_softmax(teacher_logits.float().flatten(0, -2) / t, -1)
    return F.kl_div(student, target, log_target=True, reduction="batchmean")


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


def train_steps(recipe, accelerator, model, run: Steps, state: dict, history: list, callbacks) -> dict:
    """Train `run` from global step `state["step"]` to `run.first + run.total`, logging each step to
    metrics.jsonl and saving checkpoints every `checkpoint.every_steps` global steps and at the run's last
    step; `state` (step, tokens, skipped steps) is kept up to date. Returns the last step's metrics."""
    root, world = Path(recipe.checkpoint.dir), accelerator.num_processes
    accum, step, tokens = accelerator.gradient_accumulation_steps, state["step"], state["tokens"]
    guard = NonFiniteGuard(recipe.train.max_nonfinite_steps, hint=(
        f": lower {run.lr_field} (now {run.peak_lr}) and --resume, or check the data and the weights' dtype"))
    guard.total = state["skipped_steps"]
    end = run.first + run.total
    progress = logs.Progress(run.total, step - run.first, accelerator.is_main_process, recipe.logging.every_steps,
                             label=run.stage or "")
    model.train()
    window_loss, window_parts, window_tokens, window_start = 0.0, {}, 0, time.perf_counter()
    metrics = {"step": step, "tokens": tokens}
    for batch in run.batches:
        if step >= end:
            break
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
                if update or accelerator.scaler is not None:  # fp16: the loss scaler skips non-finite steps itself
                    for group in run.optimizer.param_groups:
                        group["lr"] = lr
                    run.optimizer.step()
            run.optimizer.zero_grad(set_to_none=True)
        if not accelerator.sync_gradients:
            continue
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
        if step % recipe.checkpoint.every_steps == 0 or step == end:
            _require_finite(model, accelerator, step, root)
            checkpoint.save(accelerator, root, dict(state), write_extra=lambda d: save_resolved(recipe, d),
                            keep_last=max(1, recipe.checkpoint.keep_last),  # 0: the newest until final/ is written
                            label=run.stage)
        for callback in callbacks:
            callback(metrics)
    progress.close()
    return metrics


@torch.no_grad()
def evaluate_loss(model, loader: Iterable, max_batches: int = 50) -> float:
    """Mean next-token loss over up to `max_batches` batches (nan when the split is empty)."""
    was_training = model.training
    model.eval()
    losses = [model(**batch).loss.item() for batch in islice(loader, max_batches)]
    model.train(was_training)
    return sum(losses) / len(losses) if losses else float("nan")


def heldout_loss(model, recipe, tokenizer, device, rank: int = 0, world: int = 1) -> float:
    """Mean next-token loss on the recipe's held-out documents (`data.held_out`), packed as in training."""
    batches = micro_batches(partial(packed_loader, recipe, tokenizer, "validation"), device, rank, world, epochs=1)
    return evaluate_loss(model, batches)


def finetune(recipe, resume: bool = False, callbacks: Iterable[Callable[[dict], None]] = (),
             overwrite: bool = False) -> dict:
    """Train the model of `recipe`; returns the final metrics. With `resume`, continue from the newest
    intact checkpoint under `recipe.checkpoint.dir` (same data position, optimizer, schedule and RNG
    state; recipe changes checked, see `t2r.train.resume`), else start fresh, which needs a directory
    without another run's results or `overwrite` (delete them first). Each callback gets the metrics
    dict after every optimizer step and may raise `Interrupt` to stop."""
    if resume and overwrite:
        raise ValueError(f"--resume and --overwrite exclude each other: --resume continues the run in "
                         f"{recipe.checkpoint.dir}, --overwrite deletes it")
    accelerator = _accelerator(recipe)
    with quiet_libraries():
        from_main_process(lambda: _check_data(recipe))  # before the model loads, and before the directory is made
    lock = RunLock(recipe.checkpoint.dir) if accelerator.is_main_process else None
    try:
        note = from_main_process(lock.acquire if lock else None)
        if note:
            accelerator.print(note)
        with quiet_libraries():
            return _train(recipe, accelerator, resume, overwrite, callbacks)
    finally:
        if lock is not None:
            lock.release()


def _accelerator(recipe):
    from accelerate import Accelerator, PartialState
    from accelerate.state import AcceleratorState, GradientState

    cpu = not torch.cuda.is_available()  # accelerate only forms a multi-process CPU group when told (gloo)
    accum = recipe.grad_accum_steps(PartialState(cpu=cpu).num_processes)
    # a second run in one process (tests, notebooks) may use another precision or accumulation; the
    # process group (PartialState) is kept
    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    return Accelerator(cpu=cpu, mixed_precision=recipe.train.mixed_precision, gradient_accumulation_steps=accum,
                       log_with=recipe.logging.trackers or None, project_dir=str(Path(recipe.checkpoint.dir) / "logs"))


def _check_data(recipe) -> None:
    """Data errors before the model loads: the files' first documents, then one packed row of each part."""
    check_files(recipe.data.data_config())
    check_rows(recipe.data.data_config(), load_tokenizer(recipe.model.source), recipe.data.seq_len, recipe.train.seed)


def _train(recipe, accelerator, resume: bool, overwrite: bool, callbacks) -> dict:
    from accelerate.utils import set_seed

    train, root = recipe.train, Path(recipe.checkpoint.dir)
    found, changes = from_main_process(lambda: choose_start(recipe, resume, overwrite, accelerator.print))
    if accelerator.is_main_process:
        save_resolved(recipe, root)
    total_steps, accum = recipe.total_steps, accelerator.gradient_accumulation_steps
    set_seed(train.seed)
    if recipe.staged:
        return _finish(recipe, accelerator, *train_stages(recipe, accelerator, found, changes, callbacks))

    model, tokenizer, teacher = build_model(recipe)
    params = [p for p in model.parameters() if p.requires_grad]
    n_train, n_total = trainable_parameters(model)
    optimizer = torch.optim.AdamW(params, lr=train.lr, betas=tuple(train.betas), weight_decay=train.weight_decay)
    model, optimizer = accelerator.prepare(model, optimizer)
    if teacher is not None:
        place_teacher(teacher, accelerator.device)

    state = {"step": 0, "tokens": 0, "skipped_steps": 0, "recipe_changes": []}
    if found is not None:
        state = {**state, **checkpoint.load(accelerator, found)}
        state["recipe_changes"] = state["recipe_changes"] + [{"step": state["step"], **c} for c in changes]
        accelerator.print(f"resumed from {found} (step {state['step']}, {state['tokens']:,} tokens)")
    step, tokens = state["step"], state["tokens"]
    if recipe.logging.trackers:
        accelerator.init_trackers(recipe.name, config=logs.flat(recipe))

    accelerator.print(f"training {n_train:,} of {n_total:,} parameters for {total_steps} steps "
                      f"({accum} micro-batches of {train.micro_batch_size} x {recipe.data.seq_len} tokens "
                      f"x {accelerator.num_processes} processes per step)")
    history = logs.read_history(root / "metrics.jsonl", step) if accelerator.is_main_process else []
    world, rank = accelerator.num_processes, accelerator.process_index
    stage1 = recipe.stages.attention_transfer
    transfer_mse = None
    if stage1 is not None and step == 0 and not state.get("attention_transfer_done"):
        # a resumed run's weights already hold stage 1 (checkpoint step-0 marks it done, or any later step)
        if accelerator.is_main_process:  # a stage 1 killed before its end runs again: drop its rows
            history = [r for r in history if r.get("stage") != "attention_transfer"]
            logs.rewrite_jsonl(root / "metrics.jsonl", history)
        stage_batches = micro_batches(partial(packed_loader, recipe, tokenizer, "train"), accelerator.device,
                                      rank, world)

        def on_transfer_step(index: int, mse: float) -> None:
            if accelerator.is_main_process:
                logs.append_jsonl(root / "metrics.jsonl", {"step": 0, "stage": "attention_transfer",
                                                           "transfer_step": index, "mse": logs.finite_or_none(mse)})
                if index % recipe.logging.every_steps == 0 or index == stage1.steps:
                    print(f"attention transfer {index}/{stage1.steps}  mse {mse:.4g}", flush=True)

        transfer_mse = attention_transfer(
            accelerator.unwrap_model(model), teacher, stage_batches, stage1.steps, stage1.lr,
            reduce_grads=(lambda g: accelerator.reduce(g, "mean")) if world > 1 else None, params=stage1.params,
            autocast=accelerator.autocast, on_step=on_transfer_step)
        if not math.isfinite(transfer_mse[-1]):
            raise NonFiniteError(f"attention transfer: the MSE is {transfer_mse[-1]} after {len(transfer_mse)} steps; "
                                 "lower stages.attention_transfer.lr")
        accelerator.print(f"attention transfer: {len(transfer_mse)} steps, "
                          f"MSE {transfer_mse[0]:.4g} -> {transfer_mse[-1]:.4g}")
        # a checkpoint at step 0 holds the aligned weights: a kill before the first training checkpoint resumes
        # from here without aligning again
        _require_finite(model, accelerator, 0, root)
        state.update(attention_transfer_done=True, attention_transfer_mse=[transfer_mse[0], transfer_mse[-1]])
        checkpoint.save(accelerator, root, dict(state), write_extra=lambda d: save_resolved(recipe, d),
                        keep_last=max(1, recipe.checkpoint.keep_last))
    lr_at = partial(lr_factor, warmup_steps=train.warmup_steps, total_steps=total_steps, schedule=train.schedule,
                    min_lr_ratio=train.min_lr_ratio)
    batches = micro_batches(partial(packed_loader, recipe, tokenizer, "train"), accelerator.device, rank, world,
                            skip=step * accum * world)
    distill = recipe.stages.distill
    run = Steps(total_steps, lambda batch: (step_loss(model, batch, teacher if distill else None, distill), {}),
                optimizer, params, train.lr, lr_at, batches)
    metrics = train_steps(recipe, accelerator, model, run, state, history, callbacks)
    return _finish(recipe, accelerator, model, tokenizer, state, metrics, history)


def _finish(recipe, accelerator, model, tokenizer, state: dict, metrics: dict, history: list) -> dict:
    """After the last step: the held-out loss, the final model, final_metrics.json, the plot."""
    root, step, tokens = Path(recipe.checkpoint.dir), state["step"], state["tokens"]
    world, rank = accelerator.num_processes, accelerator.process_index

    _require_finite(model, accelerator, step, root)
    final = dict(metrics)
    final["skipped_steps"] = state["skipped_steps"]
    if state.get("attention_transfer_mse"):  # this run's stage 1, or the one a resumed run's checkpoints carry
        final["attention_transfer_mse"] = state["attention_transfer_mse"]
    if recipe.data.held_out:
        final["validation_loss"] = heldout_loss(model, recipe, tokenizer, accelerator.device, rank, world)
        final["validation_ppl"] = math.exp(min(final["validation_loss"], 50))
    accelerator.wait_for_everyone()
    out = save_final(accelerator, model, tokenizer, root, lambda d: save_resolved(recipe, d))
    if accelerator.is_main_process:
        (root / "final_metrics.json").write_text(json.dumps(final, indent=2))
        measured = any("held_out_loss" in r and r["step"] == step for r in history)  # a finished run resumed
        if "validation_loss" in final and not measured:
            logs.append_jsonl(root / "metrics.jsonl", logs.held_out_row(step, tokens, final["validation_loss"]))
        if recipe.checkpoint.keep_last == 0:
            removed = checkpoint.remove_after_final(root, out)
            if removed:
                accelerator.print(f"checkpoint.keep_last=0: deleted {', '.join(p.name for p in removed)}, {out} is "
                                  "written (--resume cannot extend this run)")
        if recipe.logging.plot:
            skipped = logs.plot(history, root / "loss.png", recipe.name)
            if skipped:
                accelerator.print(skipped)
    if recipe.logging.trackers:
        if "validation_loss" in final:
            accelerator.log({"held_out_loss": final["validation_loss"]}, step=step)
        accelerator.end_training()
    return final


def _require_finite(model, accelerator, step: int, root: Path) -> None:
    if not weights_finite(model, accelerator):
        raise NonFiniteError(f"step {step}: the weights are no longer finite, so they were not saved; the checkpoints "
                             f"in {root} hold the last finite ones (lower train.lr, then --resume or --overwrite)")
