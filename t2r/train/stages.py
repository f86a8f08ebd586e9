"""Staged recipes: `stages:` as a list (align, distill, finetune, ...) run in order inside one run.

Each stage is a `recipe.StageSection`: a loss (`next_token`, `kl` to the unconverted source, `attention_mse`
of each converted layer against its source layer, or a weighted mix of them), a budget (`steps` or `tokens`)
and its own lr, warmup, schedule, trainable set, sequence length and micro-batch; a field left unset takes
the `train:` (or `data:`) value when the recipe loads (`check_stages`), so the resolved recipe spells out
every stage. Every stage starts a fresh AdamW optimizer and its own lr schedule (warmup, then decay over
the stage's steps). Global steps and tokens run on across stages; a stage's data continues the training
stream where the stages before it stopped (at its own sequence length). Checkpoints are named
`step-<global step>-<stage>` and record the stage and its step, so a run killed anywhere resumes in that
stage with the same weights, optimizer, schedule position and data position. The teacher is built only
when a stage still to run needs it, and freed after the last such stage.
"""

from __future__ import annotations

import gc
import re
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch

from . import checkpoint, logs
from .errors import CheckpointError
from .fields import RecipeError, suggest
from .model_setup import build_model, place_teacher, select_trainable, trainable_parameters
from .schedule import lr_factor
from .transfer import AttentionTargets

LOSSES = ("next_token", "kl", "attention_mse")
TEACHER_LOSSES = ("kl", "attention_mse")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_INHERITED = {"lr": "train.lr", "warmup_steps": "train.warmup_steps", "schedule": "train.schedule",
              "min_lr_ratio": "train.min_lr_ratio", "trainable": "train.trainable", "seq_len": "data.seq_len",
              "micro_batch_size": "train.micro_batch_size"}


def find_stage(stages: list, key: str, path: str = "stages") -> int:
    """The index of the stage named `key` (or numbered `key`) in a raw stage list, for overrides."""
    names = [s.get("name") if isinstance(s, dict) else None for s in stages]
    if key in names:
        return names.index(key)
    if key.isdigit() and int(key) < len(stages):
        return int(key)
    raise RecipeError(f"{path}.{key}: no stage named {key!r}{suggest(key, [str(n) for n in names])}")


def _value(recipe, dotted: str):
    section, name = dotted.split(".")
    return getattr(getattr(recipe, section), name)


def _loss_weights(loss, where: str) -> dict[str, float]:
    weights = {loss: 1.0} if isinstance(loss, str) else dict(loss)
    for name, weight in weights.items():
        if name not in LOSSES:
            raise RecipeError(f"{where}.loss: unknown loss {name!r}{suggest(str(name), LOSSES, list_all=False)}; "
                              f"expected {' | '.join(LOSSES)}, or a weighted mix such as {{kl: 0.9, next_token: 0.1}}")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight >= 0:
            raise RecipeError(f"{where}.loss.{name}: the weight must be a number >= 0, got {weight!r}")
        weights[name] = float(weight)
    if not any(weights.values()):
        raise RecipeError(f"{where}.loss: every weight is 0; give at least one loss a weight > 0")
    return weights


def check_stages(recipe) -> None:
    """Validate a stage list and fill each stage's unset fields from `train:` / `data:` (in place)."""
    train, stages = recipe.train, recipe.stages
    if not stages:
        raise RecipeError("stages: an empty list; give at least one stage (name, loss, steps or tokens) or remove "
                          "stages")
    seen = set()
    for i, stage in enumerate(stages):
        where = f"stages[{i}]"
        if not _NAME.fullmatch(stage.name):
            raise RecipeError(f"{where}.name: {stage.name!r} is not usable in a checkpoint name; use letters, digits, "
                              "'_' and '-' (e.g. align)")
        if stage.name in seen:
            raise RecipeError(f"{where}.name: {stage.name!r} names two stages; give each stage its own name")
        seen.add(stage.name)
        where = f"stages[{i}] ({stage.name})"
        stage.loss = _loss_weights(stage.loss, where)
        if stage.steps is not None and stage.tokens is not None:
            raise RecipeError(f"{where}.steps / tokens: set exactly one of them (got both)")
        if stage.steps is None and stage.tokens is None:
            if train.max_steps is None and train.max_tokens is None:
                raise RecipeError(f"{where}.steps / tokens: missing; set the stage's steps or tokens (or "
                                  "train.max_steps / train.max_tokens for every stage without its own)")
            stage.steps, stage.tokens = train.max_steps, train.max_tokens
        if stage.tokens is not None and stage.tokens < train.tokens_per_step:
            raise RecipeError(f"{where}.tokens: {stage.tokens} is less than one step "
                              f"(train.tokens_per_step={train.tokens_per_step})")
        for name, default in _INHERITED.items():
            if getattr(stage, name) is None:
                setattr(stage, name, _value(recipe, default))
        _check_stage(recipe, stage, where)


def _check_stage(recipe, stage, where: str) -> None:
    train, target = recipe.train, recipe.convert.target
    steps = stage.num_steps(train.tokens_per_step)
    if 0 < steps <= stage.warmup_steps:
        raise RecipeError(f"{where}.warmup_steps: {stage.warmup_steps} warmup steps in a stage of {steps} steps; set "
                          f"{where.split(' ')[0]}.warmup_steps below {steps} (e.g. {max(0, steps // 10)})")
    per_micro = stage.seq_len * stage.micro_batch_size
    if train.tokens_per_step % per_micro:
        raise RecipeError(f"{where}.seq_len: {stage.seq_len} x micro_batch_size {stage.micro_batch_size} = {per_micro} "
                          f"tokens does not divide train.tokens_per_step ({train.tokens_per_step}); change one of them")
    if target == "none":
        for loss in TEACHER_LOSSES:
            if stage.loss.get(loss):
                raise RecipeError(f"{where}.loss: {loss} compares against the unconverted source, but convert.target "
                                  "is 'none' (the model is the source, there is no teacher); use next_token")
    if (stage.trainable == "lora") != (train.trainable == "lora"):
        raise RecipeError(f"{where}.trainable: {stage.trainable!r} with train.trainable={train.trainable!r}; LoRA "
                          "adapters are added once for the whole run: set train.trainable=lora and leave the stages' "
                          "trainable unset, or use all / attention / gates in every stage")
    if stage.trainable == "gates" and recipe.train.trainable != "gates":
        from .recipe import check_gates

        check_gates(recipe, f"{where}.trainable")


def describe(recipe) -> str:
    """The stage plan, one line a stage (`--dry-run`)."""
    tps = recipe.train.tokens_per_step
    lines = [f"# stages: {len(recipe.stages)}, {recipe.total_steps:,} steps, "
             f"{recipe.total_steps * tps:,} tokens in all (steps of {tps:,} tokens)"]
    for i, s in enumerate(recipe.stages, 1):
        loss = " + ".join(f"{w:g} {name}" for name, w in s.loss.items() if w)
        lines.append(f"#   {i}. {s.name}: {s.num_steps(tps):,} steps ({s.num_steps(tps) * tps:,} tokens), lr {s.lr:g} "
                     f"({s.schedule}, warmup {s.warmup_steps}, min ratio {s.min_lr_ratio:g}), loss {loss}"
                     + (f" (T={s.temperature:g})" if s.loss.get("kl") else "")
                     + f", trainable {s.trainable}, {s.micro_batch_size} x {s.seq_len} tokens a micro-batch")
    return "\n".join(lines)


def stage_loss(model, teacher, targets, stage, autocast):
    """batch -> (sum of weight x part, {part: value}); the kl part is T^2 KL(teacher || student)."""
    weights = {name: w for name, w in stage.loss.items() if w}
    t = stage.temperature

    def loss(batch: dict):
        from .loop import distill_kl

        parts = {}
        with autocast():
            if "kl" in weights or targets is not None:
                with torch.no_grad():
                    target = teacher(**{k: v for k, v in batch.items() if k != "labels"}).logits
            if "next_token" in weights or "kl" in weights:
                out = model(**batch)
                if "next_token" in weights:
                    parts["next_token"] = out.loss
                if "kl" in weights:
                    parts["kl"] = t * t * distill_kl(out.logits, target, t)
            if targets is not None:
                parts["attention_mse"] = targets.mse()
        total = sum(weights[name] * value for name, value in parts.items())
        return total, {name: value.detach().float().item() for name, value in parts.items()}

    return loss


def stage_parameters(model, recipe, stage, exact: bool = True) -> list:
    """The parameters `stage` trains. With `exact` the others are frozen; else (several processes, where the
    wrapped model's trainable set is fixed) they keep `requires_grad` and only the optimizer leaves them out."""
    if stage.trainable == "lora":  # peft chose them once
        return [p for p in model.parameters() if p.requires_grad]
    before = {p: p.requires_grad for p in model.parameters()}
    select_trainable(model, replace(recipe, train=replace(recipe.train, trainable=stage.trainable)))
    params = [p for p in model.parameters() if p.requires_grad]
    if not exact:
        for p, flag in before.items():
            p.requires_grad_(flag)
    return params


def _optimizer(recipe, params, lr: float):
    train = recipe.train
    return torch.optim.AdamW(params, lr=lr, betas=tuple(train.betas), weight_decay=train.weight_decay)


def _plan(recipe) -> list[tuple]:
    """(stage, its steps, the global step before it) for every stage."""
    out, first = [], 0
    for stage in recipe.stages:
        steps = stage.num_steps(recipe.train.tokens_per_step)
        out.append((stage, steps, first))
        first += steps
    return out


def _needs_teacher(stages) -> bool:
    return any(stage.loss.get(loss) for stage in stages for loss in TEACHER_LOSSES)


def train_stages(recipe, accelerator, found, changes, callbacks):
    """Run the stages of `recipe` in order (from `found`, a checkpoint, when resuming); returns
    (model, tokenizer, state, last metrics, history) for the loop's final steps."""
    root, world = Path(recipe.checkpoint.dir), accelerator.num_processes
    plan = _plan(recipe)
    names = [stage.name for stage, _, _ in plan]
    state = {"step": 0, "tokens": 0, "skipped_steps": 0, "recipe_changes": [], "stage": names[0], "stage_step": 0}
    saved = checkpoint.read_state(found) if found is not None else state
    if saved.get("stage") not in names:
        raise CheckpointError(f"cannot resume from {found}: it was not written by a stage of this recipe "
                                         f"(stages: {', '.join(names)})")
    index = names.index(saved["stage"])
    todo = [stage for stage, steps, first in plan[index:] if saved["step"] < first + steps]
    model, tokenizer, teacher = build_model(replace(recipe, stages=todo or [plan[-1][0]],
                                                    train=replace(recipe.train, trainable=plan[index][0].trainable)))
    if not _needs_teacher(todo):
        teacher = None
    exact = world == 1
    if not exact:  # the union of what the stages to run train stays trainable in the wrapped model
        union = {id(p) for stage in todo for p in stage_parameters(model, recipe, stage)}
        for p in model.parameters():
            p.requires_grad_(id(p) in union)
    params = stage_parameters(model, recipe, plan[index][0], exact)
    model, optimizer = accelerator.prepare(model, _optimizer(recipe, params, plan[index][0].lr))
    if teacher is not None:
        place_teacher(teacher, accelerator.device)
    if found is not None:
        state = {**state, **checkpoint.load(accelerator, found)}
        state["recipe_changes"] = state["recipe_changes"] + [{"step": state["step"], **c} for c in changes]
        accelerator.print(f"resumed from {found} (stage {state['stage']}, step {state['stage_step']} of it; global "
                          f"step {state['step']}, {state['tokens']:,} tokens)")
    if recipe.logging.trackers:
        accelerator.init_trackers(recipe.name, config=logs.flat(recipe))
    history = logs.read_history(root / "metrics.jsonl", state["step"]) if accelerator.is_main_process else []
    metrics = {"step": state["step"], "tokens": state["tokens"]}
    unwrapped = accelerator.unwrap_model(model)
    for i, (stage, steps, first) in enumerate(plan[index:], index):
        if state["step"] >= first + steps:  # finished before the checkpoint this run resumed from
            continue
        if i != index:
            params = stage_parameters(unwrapped, recipe, stage, exact)
            accelerator._optimizers.remove(optimizer)  # save_state writes the prepared optimizers: this stage's only
            optimizer = None  # the last stage's moments are freed before the new ones exist
            optimizer = accelerator.prepare_optimizer(_optimizer(recipe, params, stage.lr))
        unwrapped.zero_grad(set_to_none=True)  # gradients the last stage's optimizer did not own (several processes)
        state.update(stage=stage.name, stage_step=state["step"] - first)
        metrics = _run_stage(recipe, accelerator, model, teacher, tokenizer, (i, stage, steps, first), params,
                             optimizer, state, history, callbacks)
        if teacher is not None and not _needs_teacher([s for s, _, _ in plan[i + 1:]]):
            teacher = None  # no later stage compares against the source: free its memory
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return model, tokenizer, state, metrics, history


def _run_stage(recipe, accelerator, model, teacher, tokenizer, where, params, optimizer, state, history, callbacks):
    """Stage `where` = (index, stage, steps, global step before it) from its step `state["stage_step"]`."""
    from .loop import Steps, micro_batches, packed_loader, train_steps

    i, stage, steps, first = where
    tps, world = recipe.train.tokens_per_step, accelerator.num_processes
    data_view = replace(recipe, data=replace(recipe.data, seq_len=stage.seq_len),
                        train=replace(recipe.train, micro_batch_size=stage.micro_batch_size))
    accelerator.gradient_accumulation_steps = data_view.grad_accum_steps(world)
    accelerator.step = 0  # a stage starts on an optimizer-step boundary, whatever the last one accumulated
    per_micro = stage.seq_len * stage.micro_batch_size
    skip = (first * tps + state["stage_step"] * tps) // per_micro  # the stream continues across stages
    batches = micro_batches(partial(packed_loader, data_view, tokenizer, "train"), accelerator.device,
                            accelerator.process_index, world, skip=skip)
    unwrapped = accelerator.unwrap_model(model)
    targets = AttentionTargets(unwrapped, teacher) if stage.loss.get("attention_mse") else None
    n_train, n_total = sum(p.numel() for p in params), trainable_parameters(unwrapped)[1]
    accelerator.print(f"stage {i + 1}/{len(recipe.stages)} {stage.name}: {steps} steps from step "
                      f"{state['stage_step']}, lr {stage.lr:g} ({stage.schedule}, warmup {stage.warmup_steps}), loss "
                      + " + ".join(f"{w:g} {n}" for n, w in stage.loss.items() if w)
                      + f"; training {n_train:,} of {n_total:,} parameters ({stage.trainable}); "
                      f"{accelerator.gradient_accumulation_steps} micro-batches of {stage.micro_batch_size} x "
                      f"{stage.seq_len} tokens x {world} processes per step")
    lr_at = partial(lr_factor, warmup_steps=stage.warmup_steps, total_steps=steps, schedule=stage.schedule,
                    min_lr_ratio=stage.min_lr_ratio)
    # attention MSE alone never runs the wrapped model's forward, so data-parallel gradients are averaged by hand
    manual_sync = world > 1 and not (stage.loss.get("next_token") or stage.loss.get("kl"))
    run = Steps(steps, stage_loss(model, teacher, targets, stage, accelerator.autocast), optimizer, params, stage.lr,
                lr_at, batches, first=first, stage=stage.name, lr_field=f"stages.{stage.name}.lr",
                manual_grad_sync=manual_sync)
    try:
        return train_steps(recipe, accelerator, model, run, state, history, callbacks)
    finally:
        if targets is not None:
            targets.close()
