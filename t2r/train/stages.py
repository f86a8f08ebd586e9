"""A recipe's training, stage by stage: every recipe is a list of stages (align, distill, finetune, ...), run in
order inside one run; a recipe without `stages:` is one stage from `train:` (`Recipe.stage_list`).

Each stage is a `recipe.StageSection`: a loss (`next_token`, `kl` to the unconverted source, `attention_mse`
of each converted layer against its source layer, or a weighted mix of them: `t2r.train.losses`), a budget
(`steps` or `tokens`) and its own lr, warmup, schedule, trainable set, sequence length and micro-batch; a field
left unset takes the `train:` (or `data:`) value when the recipe loads (`t2r.train.checks`), so the resolved
recipe spells out every stage. Every stage starts a fresh optimizer and its own lr schedule (warmup, then decay
over the stage's steps). Global steps and tokens run on across stages; a stage's data continues the training
stream where the stages before it stopped (at its own sequence length). Checkpoints are named
`step-<global step>-<stage>` and record the stage and its step, so a run killed anywhere resumes in that
stage with the same weights, optimizer, schedule position and data position. The teacher is built only
when a stage still to run needs it, and freed after the last such stage.
"""

from __future__ import annotations

import gc
from functools import partial
from pathlib import Path

import torch

from t2r.data.packing import PIECE_CHARS
from t2r.optim import build_optimizer
from t2r.words import counted

from . import checkpoint, logs
from .batches import heldout_loss, micro_batches, packed_loader
from .errors import CheckpointError
from .gradient_sync import use_gradient_sync
from .losses import stage_loss
from .model_setup import build_model, place_teacher, select_trainable, trainable_parameters
from .recipe import needs_teacher
from .schedule import lr_factor
from .startup import StartupClock
from .steps import Steps, train_steps
from .transfer import AttentionTargets, shard_apart


def describe(recipe) -> str:
    """The stage plan, one line a stage (`--dry-run`)."""
    tps = recipe.train.tokens_per_step
    stages = recipe.stage_list
    lines = [f"# stages: {len(stages)}, {counted(recipe.total_steps, 'step')}, "
             f"{recipe.total_steps * tps:,} tokens in all (steps of {tps:,} tokens)"]
    for i, s in enumerate(stages, 1):
        loss = " + ".join(f"{w:g} {name}" for name, w in s.loss.items() if w)
        steps = s.num_steps(tps)
        lines.append(f"#   {i}. {s.name}: {counted(steps, 'step')} ({steps * tps:,} tokens), lr {s.lr:g} "
                     f"({s.schedule}, warmup {s.warmup_steps}, min ratio {s.min_lr_ratio:g}), loss {loss}"
                     + (f" (T={s.temperature:g})" if s.loss.get("kl") else "")
                     + f", trainable {s.trainable}, {s.micro_batch_size} x {s.seq_len} tokens a micro-batch")
    return "\n".join(lines)


def stage_parameters(model, recipe, stage, exact: bool = True) -> list:
    """The parameters `stage` trains. With `exact` the others are frozen; else (several processes, where the
    wrapped model's trainable set is fixed) they keep `requires_grad` and only the optimizer leaves them out."""
    if stage.trainable == "lora":  # peft chose them once
        return [p for p in model.parameters() if p.requires_grad]
    before = {p: p.requires_grad for p in model.parameters()}
    select_trainable(model, recipe, stage.trainable)
    params = [p for p in model.parameters() if p.requires_grad]
    if not exact:
        for p, flag in before.items():
            p.requires_grad_(flag)
    return params


def _plan(recipe) -> list[tuple]:
    """(stage, its steps, the global step before it) for every stage."""
    out, first = [], 0
    for stage in recipe.stage_list:
        steps = stage.num_steps(recipe.train.tokens_per_step)
        out.append((stage, steps, first))
        first += steps
    return out


def train_stages(recipe, accelerator, found, changes, callbacks, clock=None, record: dict | None = None):
    """Run the stages of `recipe` in order (from `found`, a checkpoint, when resuming); returns
    (model, tokenizer, state, last metrics, history) for the run's final steps. `clock`, a `StartupClock`,
    times the start up to the first step; `record` goes into the trainer state of every checkpoint."""
    clock = clock or StartupClock()
    root, world = Path(recipe.checkpoint.dir), accelerator.num_processes
    plan = _plan(recipe)
    names = [stage.name for stage, _, _ in plan]
    state = {"step": 0, "tokens": 0, "skipped_steps": 0, "recipe_changes": [], **(record or {})}
    if recipe.stages is not None:
        state.update(stage=names[0], stage_step=0)
    saved = checkpoint.read_state(found) if found is not None else state
    if len(names) == 1 and "stage" not in saved:  # one stage (the recipe without stages, or one read from the
        saved = {**saved, "stage": names[0]}     # older mapping form): its checkpoints need not name it
    if saved.get("stage", names[0]) not in names:
        raise CheckpointError(f"cannot resume from {found}: it was not written by a stage of this recipe "
                              f"(stages: {', '.join(names)})")
    index = names.index(saved["stage"])
    todo = [stage for stage, steps, first in plan[index:] if saved["step"] < first + steps]
    model, tokenizer, teacher = build_model(recipe, clock=clock, device=accelerator.device,
                                            trainable=plan[index][0].trainable,
                                            teacher=needs_teacher(todo))
    exact = world == 1
    if not exact:  # the union of what the stages to run train stays trainable in the wrapped model
        union = {id(p) for stage in todo for p in stage_parameters(model, recipe, stage)}
        for p in model.parameters():
            p.requires_grad_(id(p) in union)
    params = stage_parameters(model, recipe, plan[index][0], exact)
    if _sharded(accelerator) and any(stage.loss.get("attention_mse") for stage in todo):
        shard_apart(model)
    with clock.part("prepare"):
        model, optimizer = accelerator.prepare(model, build_optimizer(params, plan[index][0].lr, recipe.train,
                                                                              device=accelerator.device))
        use_gradient_sync(model, recipe.train.gradient_sync)
        if teacher is not None:
            place_teacher(teacher, accelerator.device)
    if found is not None:
        with clock.part("resume"):
            state = {**state, **checkpoint.load(accelerator, found)}
        if state["step"] < recipe.total_steps:  # changes that train nothing are not part of the model's history
            state["recipe_changes"] = state["recipe_changes"] + [{"step": state["step"], **c} for c in changes]
        where = (f"stage {state['stage']}, step {state['stage_step']} of it; global step "
                 if recipe.stages is not None else "step ")
        accelerator.print(f"resumed from {found} ({where}{state['step']}, {state['tokens']:,} tokens)")
    if recipe.logging.trackers:
        accelerator.init_trackers(recipe.name, config=logs.flat(recipe))
    history = (logs.read_history(root / "metrics.jsonl", state["step"], accelerator.print)
               if accelerator.is_main_process else [])
    if found is None and recipe.data.held_out:  # what the final model's held-out loss is checked against
        with clock.part("held-out loss"):
            state["held_out_start"] = _held_out_start(model, recipe, tokenizer, accelerator)
    metrics = {"step": state["step"], "tokens": state["tokens"]}
    unwrapped = accelerator.unwrap_model(model)
    for i, (stage, steps, first) in enumerate(plan[index:], index):
        if state["step"] >= first + steps:  # finished before the checkpoint this run resumed from
            continue
        if i != index:
            params = stage_parameters(unwrapped, recipe, stage, exact)
            accelerator._optimizers.remove(optimizer)  # save_state writes the prepared optimizers: this stage's only
            optimizer = None  # the last stage's moments are freed before the new ones exist
            optimizer = accelerator.prepare_optimizer(build_optimizer(params, stage.lr, recipe.train,
                                                                      device=accelerator.device))
        unwrapped.zero_grad(set_to_none=True)  # gradients the last stage's optimizer did not own (several processes)
        if recipe.stages is not None:
            state.update(stage=stage.name, stage_step=state["step"] - first)
        metrics = _run_stage(recipe, accelerator, model, teacher, tokenizer, (i, stage, steps, first), optimizer,
                             state, history, callbacks, clock)
        if teacher is not None and not needs_teacher([s for s, _, _ in plan[i + 1:]]):
            teacher = None  # no later stage compares against the source: free its memory
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return model, tokenizer, state, metrics, history


def _held_out_start(model, recipe, tokenizer, accelerator) -> float:
    """The held-out loss before training (`t2r.train.guard.collapsed_model`), drawing no random number."""
    devices = [accelerator.device] if accelerator.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        return heldout_loss(model, recipe, tokenizer, accelerator.device, accelerator.process_index,
                            accelerator.num_processes)


def _stream_start(saved: dict | None, skip: int, packing: dict) -> dict | None:
    """The data stream's position saved with the checkpoint (or left by the stage before), where it is one of
    this stage's stream (the same packing) at or before `skip`; None: the stream is read up to `skip`."""
    if saved and saved.get("index", skip + 1) <= skip and all(saved.get(k) == v for k, v in packing.items()):
        return saved
    return None


def stepped_parameters(model, optimizer) -> list:
    """The parameters `optimizer` steps, in `model`'s order. After `accelerator.prepare` these are the model's own,
    not the list the optimizer was built from: FSDP2 replaces each parameter by a sharded DTensor and re-points the
    optimizer, and the gradients live on the new ones (clipping the old list clipped nothing; comparing it with the
    model's, as accelerate's `clip_grad_norm_` does, raised "mixed torch.Tensor and DTensor")."""
    stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
    return [p for p in model.parameters() if id(p) in stepped]


def _sharded(accelerator) -> bool:
    """Whether the model's weights are sharded (FSDP): gathered only inside the wrapped model's forward."""
    from accelerate.utils import DistributedType

    return accelerator.distributed_type == DistributedType.FSDP


def _fusable(model) -> bool:
    """Whether the fused KL applies: no logit soft-capping (under FSDP2 too: `t2r.train.losses.whole_weight`)."""
    config = getattr(model, "config", None)
    return not getattr(config, "final_logit_softcapping", None)


def _run_stage(recipe, accelerator, model, teacher, tokenizer, where, optimizer, state, history, callbacks, clock):
    """Stage `where` = (index, stage, steps, global step before it) from its step `state["stage_step"]`."""
    i, stage, steps, first = where
    named = recipe.stages is not None  # the one stage of a recipe without stages is unnamed, as it always was
    tps, world = recipe.train.tokens_per_step, accelerator.num_processes
    accelerator.gradient_accumulation_steps = recipe.grad_accum_steps(world, stage)
    accelerator.step = 0  # a stage starts on an optimizer-step boundary, whatever the last one accumulated
    per_micro = stage.seq_len * stage.micro_batch_size
    skip = state["step"] * tps // per_micro  # the stream continues across stages
    # what a saved stream position must match to be reused (positions count pieces of PIECE_CHARS, and epochs end
    # on whole micro-batches, since 2026-11-27)
    packing = {"seq_len": stage.seq_len, "micro_batch_size": stage.micro_batch_size, "piece_chars": PIECE_CHARS,
               "whole_micro_batches": True}
    batches = micro_batches(partial(packed_loader, recipe, tokenizer, "train", stage=stage), accelerator.device,
                            accelerator.process_index, world, skip=skip, key=packing,
                            start=_stream_start(state.get("data_position"), skip, packing), reader=recipe.data.reader)
    unwrapped = accelerator.unwrap_model(model)
    sharded = _sharded(accelerator)
    targets = (AttentionTargets(unwrapped, teacher, through_forward=sharded) if stage.loss.get("attention_mse")
               else None)
    params = stepped_parameters(model, optimizer)
    n_train, n_total = sum(p.numel() for p in params), trainable_parameters(unwrapped)[1]
    accelerator.print(f"stage {i + 1}/{len(recipe.stage_list)} {stage.name}: {counted(steps, 'step')} from step "
                      f"{state['step'] - first}, lr {stage.lr:g} ({stage.schedule}, warmup {stage.warmup_steps}"
                      + (f", longer than the stage: its lr peaks at {stage.lr * steps / stage.warmup_steps:.3g}"
                         if stage.warmup_steps > steps else "") + "), loss "
                      + " + ".join(f"{w:g} {n}" for n, w in stage.loss.items() if w)
                      + f"; training {n_train:,} of {n_total:,} parameters ({stage.trainable}); "
                      f"{counted(accelerator.gradient_accumulation_steps, 'micro-batch')} of {stage.micro_batch_size} "
                      f"x {stage.seq_len} tokens x {counted(world, 'process')} per step")
    lr_at = partial(lr_factor, warmup_steps=stage.warmup_steps, total_steps=steps, schedule=stage.schedule,
                    min_lr_ratio=stage.min_lr_ratio)
    # attention MSE alone never runs the wrapped model's forward (except under FSDP), so data-parallel gradients
    # are averaged by hand
    manual_sync = world > 1 and not sharded and not (stage.loss.get("next_token") or stage.loss.get("kl"))
    fused = recipe.train.fused_kl and _fusable(unwrapped)
    run = Steps(steps, stage_loss(model, teacher, targets, stage, accelerator.autocast, fused), optimizer, params,
                stage.lr, lr_at, batches, first=first, stage=stage.name if named else None,
                lr_field=f"stages.{stage.name}.lr" if named else "train.lr",
                manual_grad_sync=manual_sync, clock=clock, micro_tokens=per_micro)
    try:
        return train_steps(recipe, accelerator, model, run, state, history, callbacks)
    finally:
        if targets is not None:
            targets.close()
