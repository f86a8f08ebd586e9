"""The cross-field checks of a recipe (`check_recipe`), the checks and defaults of its stage list
(`check_stages`), and the reading of the older `stages:` mapping into a list (`stages_from_sections`).

Each check raises `RecipeError` naming the field path and what to change; `t2r.train.recipe` calls them
before `load_recipe` returns.
"""

from __future__ import annotations

import importlib.util
import os
import re
import typing

import yaml

from t2r.convert.layer_spec import check_layer_spec
from t2r.eval.settings import HELD_OUT
from t2r.layers import MIXERS, get_mixer
from t2r.layers.registry import teacher_init_targets
from t2r.paths import check_model_spec, is_local

from .fields import RecipeError, coerce, suggest

LOSSES = ("next_token", "kl", "attention_mse")
TEACHER_LOSSES = ("kl", "attention_mse")
TRACKER_PACKAGES = {"tensorboard": ("tensorboard", "tensorboardX"), "wandb": ("wandb",)}
"""The packages accelerate looks for to run each tracker (any one of them)."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_INHERITED = {"lr": "train.lr", "warmup_steps": "train.warmup_steps", "schedule": "train.schedule",
              "min_lr_ratio": "train.min_lr_ratio", "trainable": "train.trainable", "seq_len": "data.seq_len",
              "micro_batch_size": "train.micro_batch_size"}


def stages_from_sections(sections: dict, data: dict) -> list | None:
    """The stage list of the older mapping form `stages: {attention_transfer: ..., distill: ...}`.

    `distill: {weight: w, temperature: T}` alone is one stage with the loss w KL + (1 - w) next-token, as it
    always was. `attention_transfer` counted micro-batches outside the token budget, each with its own
    optimizer step, and its data restarted for the next stage: no stage of a list means that, so it is
    refused with the nearest list printed."""
    known = {"attention_transfer", "distill"}
    unknown = sorted(set(sections) - known)
    if unknown:
        raise RecipeError(f"stages.{unknown[0]}: unknown section{suggest(unknown[0], sorted(known))}; or write "
                          "stages as a list (name, loss, steps or tokens each)")
    distill, transfer = sections.get("distill"), sections.get("attention_transfer")
    if distill is not None and not isinstance(distill, dict):
        raise RecipeError(f"stages.distill: expected a section (weight, temperature), got {distill!r}")
    main = None
    if distill is not None:
        weight = distill.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 <= weight <= 1:
            raise RecipeError(f"stages.distill.weight: expected a number in [0, 1], got {weight!r}")
        unknown = sorted(set(distill) - {"weight", "temperature"})
        if unknown:
            raise RecipeError(f"stages.distill.{unknown[0]}: unknown field; expected weight, temperature")
        loss = {name: w for name, w in (("kl", float(weight)), ("next_token", 1.0 - weight)) if w}
        main = {"name": "distill", "loss": loss, "temperature": distill.get("temperature", 1.0)}
    if transfer is None:
        return None if main is None else [main]
    if not isinstance(transfer, dict):
        raise RecipeError(f"stages.attention_transfer: expected a section (steps, lr, params), got {transfer!r}")
    train, cfg_data = data.get("train") or {}, data.get("data") or {}
    per_step = train.get("tokens_per_step", 0)
    micro = (cfg_data.get("seq_len") or 2048) * (train.get("micro_batch_size") or 1)
    tokens = transfer.get("steps", 1) * micro
    steps = max(1, -(-tokens // per_step)) if isinstance(per_step, int) and per_step > 0 else None
    align = {"name": "align", "loss": "attention_mse", "steps": steps, "lr": transfer.get("lr", 1e-3),
             "schedule": "constant", "warmup_steps": 0,
             "trainable": "gates" if transfer.get("params") == "gates" else "attention"}
    listed = [align, main or {"name": "train", "loss": "next_token"}]
    raise RecipeError(
        "stages.attention_transfer: the mapping form of stages is read into a stage list, and a list has no "
        "stage that counts micro-batches outside the token budget as stages.attention_transfer did; write the "
        f"stages as a list instead. The nearest (align takes {steps} optimizer steps of train.tokens_per_step "
        f"tokens, about the {tokens:,} tokens of {transfer.get('steps')} micro-batches, from the training "
        "stream; the next stage continues it):\n" + yaml.safe_dump({"stages": listed}, sort_keys=False))


def find_stage(stages: list, key: str, path: str = "stages") -> int:
    """The index of the stage named `key` (or numbered `key`) in a raw stage list, for overrides."""
    names = [s.get("name") if isinstance(s, dict) else None for s in stages]
    if key in names:
        return names.index(key)
    if key.isdigit() and int(key) < len(stages):
        return int(key)
    raise RecipeError(f"{path}.{key}: no stage named {key!r}{suggest(key, [str(n) for n in names])}")


def loss_weights(loss, where: str) -> dict[str, float]:
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


def _value(recipe, dotted: str):
    section, name = dotted.split(".")
    return getattr(getattr(recipe, section), name)


def check_stages(recipe) -> None:
    """Validate a stage list and fill each stage's unset fields from `train:` / `data:` (in place)."""
    train, stages = recipe.train, recipe.stages
    if not stages:
        raise RecipeError("stages: an empty list; give at least one stage (name, loss, steps or tokens) or remove "
                          "stages")
    budget = train.max_steps if train.max_steps is not None else train.max_tokens
    inherits = [(s.steps is None and s.tokens is None) or (s.steps is not None and s.steps == train.max_steps)
                or (s.tokens is not None and s.tokens == train.max_tokens) for s in stages]  # (a resolved recipe)
    if budget is not None and not any(inherits):
        field = "max_steps" if train.max_steps is not None else "max_tokens"
        own = ", ".join(f"{s.name}: {s.steps if s.steps is not None else s.tokens:,} "
                        f"{'steps' if s.steps is not None else 'tokens'}" for s in stages)
        raise RecipeError(f"train.{field}={budget:,} applies to no stage: every stage has its own budget ({own}); "
                          "set stages.<name>.steps or stages.<name>.tokens instead")
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
        stage.loss = loss_weights(stage.loss, where)
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
        own_warmup = stage.warmup_steps not in (None, train.warmup_steps)
        for name, default in _INHERITED.items():
            if getattr(stage, name) is None:
                setattr(stage, name, _value(recipe, default))
        _check_stage(recipe, stage, where, own_warmup)


def _check_stage(recipe, stage, where: str, own_warmup: bool = True) -> None:
    """A stage's own checks; a warmup as long as the stage is refused only where the stage sets it (one taken
    from `train:` warms up through a short stage, as a recipe without stages always could)."""
    train, target = recipe.train, recipe.convert.target
    steps = stage.num_steps(train.tokens_per_step)
    if own_warmup and 0 < steps <= stage.warmup_steps:
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
        check_gates(recipe, f"{where}.trainable")


def check_gates(recipe, where: str) -> None:
    """`trainable: gates` needs a target that adds gates (or a window, whose gain counts, even in retnet)."""
    convert = recipe.convert
    windowed = bool((convert.options or {}).get("window"))
    if convert.target == "none" or not (get_mixer(convert.target).adds_parameters or windowed):
        raise RecipeError(f"{where}: 'gates' trains the new gates, and target {convert.target!r} adds none; "
                          f"use {where}=attention or all")


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a parent that is not a package; a module without a spec
        return False


def check_recipe(recipe, check_files: bool) -> None:
    """Every check that spans fields or sections, then the stage list, then (with `check_files`) the paths."""
    train, convert = recipe.train, recipe.convert
    staged = recipe.stages is not None
    check_name(recipe.name, recipe.checkpoint.dir)
    if (train.max_steps is None) == (train.max_tokens is None) and not (staged and train.max_steps is None):
        got = "both" if train.max_steps is not None else "neither"
        raise RecipeError(f"train.max_steps / train.max_tokens: set exactly one of them (got {got})")
    if train.max_tokens is not None and train.max_tokens < train.tokens_per_step:
        raise RecipeError(f"train.max_tokens: {train.max_tokens} is less than one step "
                          f"(train.tokens_per_step={train.tokens_per_step})")
    recipe.grad_accum_steps(1)  # tokens_per_step must split into whole micro-batches
    if recipe.model.dtype == "float16" and train.mixed_precision == "no":
        raise RecipeError("model.dtype: float16 weights trained without mixed precision overflow (the loss is nan "
                          "after the first update); use model.dtype=bfloat16 or float32, or train.mixed_precision=fp16 "
                          "(fp32 master weights)")
    if train.trainable == "lora" and recipe.lora is None:
        raise RecipeError("lora: missing; train.trainable=lora needs a lora section (e.g. lora.r=16)")
    if train.trainable != "lora" and recipe.lora is not None:
        raise RecipeError(f"lora: set, but train.trainable is {train.trainable!r}; "
                          "set train.trainable=lora or remove the lora section")
    if convert.init == "teacher" and convert.target not in teacher_init_targets():
        raise RecipeError(f"convert.init: 'teacher' sets learned forget-gate decays, which {convert.target!r} does not "
                          f"have (supported: {', '.join(teacher_init_targets())}); use convert.init=default")
    if train.trainable == "gates":
        check_gates(recipe, "train.trainable")
    if convert.target == "none":
        for bad, what in ((convert.layers is not None, "convert.layers"), (bool(convert.options), "convert.options")):
            if bad:
                raise RecipeError(f"{what}: needs converted layers, but convert.target is 'none' (baseline)")
    else:
        _check_conversion(convert)
    if staged:
        check_stages(recipe)
    for tracker in recipe.logging.trackers:  # accelerate would only warn, then log nothing
        if not any(map(_installed, TRACKER_PACKAGES[tracker])):
            raise RecipeError(f"logging.trackers: {tracker} is not installed (pip install {tracker}); or remove it: "
                              "metrics.jsonl and loss.png hold the curves")
    if recipe.eval is not None:
        if recipe.eval.data == HELD_OUT and not recipe.data.held_out:
            raise RecipeError(f"eval.data: {HELD_OUT!r} scores the recipe's held-out documents; set data.held_out "
                              "to a number of documents (e.g. 16)")
        try:
            recipe.eval.harness_specs()  # lm-eval task names, checked against the installed index
        except (ValueError, ImportError) as err:
            raise RecipeError(f"eval: {err}") from None
    if check_files:
        _check_paths(recipe)


def check_positions(recipe) -> None:
    """Every stage's rows fit the positions the source was trained on (its config's `max_position_embeddings`):
    beyond them its softmax layers, its RoPE and a distillation teacher meet positions they never saw. Reads the
    source's config alone; one that cannot be read (an offline hub id) is left to the model's loading."""
    from t2r.sources import shape_config

    try:
        limit = getattr(shape_config(recipe.model.source), "max_position_embeddings", None)
    except OSError:
        return
    for i, stage in enumerate(recipe.stage_list):
        if limit and stage.seq_len > limit:
            where = "data.seq_len" if recipe.stages is None else f"stages[{i}] ({stage.name}).seq_len"
            raise RecipeError(f"{where}: {stage.seq_len:,} tokens a row, longer than the {limit:,} positions "
                              f"{recipe.model.source} was trained on (max_position_embeddings); lower it to {limit:,} "
                              "or less")


def check_name(name: str, directory: str) -> None:
    """`name` names the run's directory (checkpoint.dir `runs/{name}`): a relative path that stays below the
    directory's parent, never absolute, `~`, `..` or `.`."""
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
    if os.path.isabs(name) or name.startswith("~") or ".." in parts or not parts:
        raise RecipeError(f"name: {name!r} would put the run's directory outside runs/ (checkpoint.dir is "
                          f"{directory!r}); use a plain name such as 'my-run' (letters, digits, '-', '_'; "
                          "'/' for a subfolder)")


def _check_conversion(convert) -> None:
    if convert.layers is not None:
        try:
            check_layer_spec(convert.layers)
        except ValueError as err:
            raise RecipeError(f"convert.layers: {err}") from None
    spec = get_mixer(convert.target)
    hints = typing.get_type_hints(spec.options)
    for key, value in convert.options.items():
        if key not in hints:
            owners = [name for name, other in MIXERS.items() if key in other.options.field_names()]
            if owners:
                raise RecipeError(f"convert.options.{key}: an option of {', '.join(owners)}, not of "
                                  f"{convert.target}; remove it, or set convert.options={{}} for its defaults")
            raise RecipeError(f"convert.options.{key}: unknown option{suggest(key, list(hints))}")
        convert.options[key] = coerce(value, hints[key], f"convert.options.{key}")
    try:
        spec.resolve_options(**convert.options)
    except (ValueError, TypeError) as err:
        raise RecipeError(f"convert.options: {err}") from None


def _check_paths(recipe) -> None:
    from t2r.data.files import local_files

    try:  # one rule for local paths vs hub ids (t2r.paths): a missing local path fails here, by name
        check_model_spec(recipe.model.source)
    except FileNotFoundError as err:
        raise RecipeError(f"model.source: {err}") from None
    try:
        if is_local(recipe.data.path):
            local_files(os.path.expanduser(recipe.data.path))  # a supported format, as the loader reads it
    except (FileNotFoundError, ValueError) as err:
        raise RecipeError(f"data.path: {err}") from None
