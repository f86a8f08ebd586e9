"""Where a run starts: afresh in a directory it may claim, or from the newest intact checkpoint of a recipe
that still describes the same run.

On `--resume` the recipe given now is compared with the resolved recipe stored in the checkpoint. Fields
in `MUTABLE` (how long to train, the learning-rate schedule from the next step on, clipping, how often
to checkpoint and log, what to evaluate) are applied and recorded in the trainer state; a change to any
other field (model, conversion, data, batch, seed, optimizer, stages, trainable parameters) would make
the resumed run a different run, so it is refused with the list of differences. A stage list
(`t2r.train.stages`) may not change at all: its differences are listed stage by stage.
"""

from __future__ import annotations

from dataclasses import MISSING
from pathlib import Path
from typing import Callable

import yaml

from t2r.convert.settings import ConvertSettings
from t2r.data.fingerprint import changes as data_changes
from t2r.settings import default_of

from . import checkpoint, run_dir
from .errors import CheckpointError, RunDirError
from .fields import recipe_fields

MUTABLE = ("name", "data.reader", "train.max_steps", "train.max_tokens", "train.lr", "train.min_lr_ratio",
           "train.warmup_steps", "train.schedule", "train.grad_clip", "train.gradient_checkpointing",
           "train.max_nonfinite_steps", "train.max_collapsed_steps", "train.fused_kl", "train.gradient_sync",
           "train.gradient_bucket_mb", "train.collect_garbage", "train.compile", "checkpoint", "logging", "eval")
"""Recipe fields (or whole sections) that may change between a run and its resumption."""


def flatten(values, prefix: str = "") -> dict:
    """{'section.field': value} for every leaf of a nested mapping (a section that is null is one leaf)."""
    if isinstance(values, dict) and values:
        out = {}
        for key, value in values.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: values}


def with_added_fields(stored: dict) -> dict:
    """A stored recipe with the `convert:` fields it lacks (added to t2r after it was written) at their defaults,
    which that run used."""
    convert = stored.get("convert")
    if not isinstance(convert, dict):
        return stored
    added = {f.name: default_of(f) for f in recipe_fields(ConvertSettings)
             if f.name not in convert and default_of(f) is not MISSING}
    return {**stored, "convert": {**convert, **added}}


def differences(stored: dict, current: dict) -> list[tuple[str, object, object]]:
    """(field, stored value, current value) for every field that differs, in field order; a `convert:` field the
    stored recipe predates counts at its default (`with_added_fields`)."""
    old, new = flatten(with_added_fields(stored)), flatten(current)
    unset = "(unset)"
    keys = list(old) + [k for k in new if k not in old]
    return [(k, old.get(k, unset), new.get(k, unset)) for k in keys if old.get(k, unset) != new.get(k, unset)]


def is_mutable(field: str) -> bool:
    return any(field == m or field.startswith(m + ".") for m in MUTABLE)


def compare(recipe, found: Path, log: Callable[[str], None] = print) -> list[dict]:
    """The applied changes `[{field, from, to}]` of `recipe` against the one `found` was trained with;
    CheckpointError listing the fields that may not change."""
    stored = yaml.safe_load((found / "recipe.yaml").read_text())
    if isinstance(stored.get("stages"), dict) and not any(stored["stages"].values()):
        stored["stages"] = None  # the older mapping form with no stage set: a recipe without stages
    current = yaml.safe_load(yaml.safe_dump(recipe.to_dict(), sort_keys=False))  # tuples as lists, like stored
    check_stage_list(stored.get("stages"), current.get("stages"), found)
    changes = differences(stored, current)
    fixed = [c for c in changes if not is_mutable(c[0])]
    if fixed:
        lines = "\n".join(f"  {field}: {old!r} -> {new!r}" for field, old, new in fixed)
        raise CheckpointError(
            f"--resume: the recipe differs from the one {found.name} was trained with, in fields that cannot change "
            f"mid-run:\n{lines}\nundo these changes to resume, or start a new run (--overwrite, or another "
            "checkpoint.dir)")
    for field, old, new in changes:
        log(f"--resume: {field} changed from {old!r} to {new!r}; applied from step {checkpoint.step_of(found) + 1}")
    return [{"field": f, "from": old, "to": new} for f, old, new in changes]


def _by_name(stages) -> dict:
    if not isinstance(stages, list):
        return {"(no stage list: one stage from train:)": stages}
    return {str(stage.get("name", i)): stage for i, stage in enumerate(stages)}


def check_stage_list(stored, current, found: Path) -> None:
    """A stage list (`t2r.train.stages`) is fixed for the whole run: any change to it, or between it and the
    fixed sections, is refused, stage by stage."""
    if stored == current or not (isinstance(stored, list) or isinstance(current, list)):
        return
    old, new = _by_name(stored), _by_name(current)
    lines = [f"  stages.{key}: {a!r} -> {b!r}" for key, a, b in differences(old, new)]
    if list(old) != list(new):
        lines.insert(0, f"  stage order: {', '.join(old)} -> {', '.join(new)}")
    raise CheckpointError(
        f"--resume: the stage list differs from the one {found.name} was trained with:\n" + "\n".join(lines)
        + "\na staged run keeps its stages (and the train/data values they took) from start to end: undo these "
        "changes to resume, or start a new run (--overwrite, or another checkpoint.dir)")


def check_same_data(found: Path, current: dict | None) -> None:
    """CheckpointError when the local data files differ from those `found` was trained on (`t2r.data.fingerprint`);
    checkpoints written before fingerprints pass."""
    lines = data_changes(checkpoint.read_state(found).get("data_files"), current)
    if lines:
        raise CheckpointError(
            f"--resume: the training data changed since {found.name} was written:\n  " + "\n  ".join(lines)
            + "\nresuming would not continue the same data stream: restore the data as it was, or start a new run "
            "(--overwrite, or another checkpoint.dir)")


def check_restartable(recipe, root: Path) -> None:
    """`--resume` without a checkpoint starts the run again only where a run of this same recipe stopped before
    its first checkpoint: `root` holds t2r's recipe.yaml of this run and nothing a run writes later (see
    `run_dir.BEFORE_FIRST_CHECKPOINT`). Anywhere else it is refused, and nothing is deleted."""
    why = _why_not_restartable(recipe, root)
    if why:
        refuse(root, why)


def require_run_dir(root: Path) -> None:
    """Before `--resume` locks (and so creates) `root`: refused when it does not exist."""
    if not root.is_dir():
        refuse(root, "the directory does not exist")


def refuse(root: Path, why: str) -> None:
    raise RunDirError(f"--resume: no checkpoint (step-*/) in {root}: {why}; nothing was deleted. "
                      f"{run_dir.nearby_runs(root)}. Set name (or checkpoint.dir) to the run to continue, or drop "
                      "--resume to start a new run")


def _why_not_restartable(recipe, root: Path) -> str | None:
    other = run_dir.not_from_a_started_run(root)
    if other:
        return f"it holds {', '.join(other[:5])}, which no run writes before its first checkpoint"
    try:
        stored = yaml.safe_load((root / "recipe.yaml").read_text())
    except (OSError, yaml.YAMLError):
        stored = None
    if not isinstance(stored, dict):
        return "it holds no recipe.yaml written by a run of t2r"
    current = yaml.safe_load(yaml.safe_dump(recipe.to_dict(), sort_keys=False))
    fixed = [field for field, _, _ in differences(stored, current) if not is_mutable(field)]
    if fixed:
        return f"its recipe.yaml is another run's ({', '.join(fixed[:3])} differ)"
    return None


def choose_start(recipe, resume: bool, overwrite: bool, log: Callable[[str], None] = print):
    """(checkpoint to resume from or None, applied recipe changes) for a run in `recipe.checkpoint.dir`,
    which the caller has locked. A fresh start claims the directory (see `run_dir.claim`)."""
    root = Path(recipe.checkpoint.dir)
    found = checkpoint.resumable(root, log) if resume else None
    if found is None:
        if resume and (root / "final").is_dir():
            raise RunDirError(f"--resume: {root} holds a finished run (final/) and no checkpoint to continue it from "
                              "(checkpoint.keep_last: 0 deletes them once final/ is written): --overwrite starts "
                              "afresh, or set checkpoint.dir to a new directory")
        if resume:  # a run stopped before its first checkpoint: its logs go, the run starts again from step 0
            check_restartable(recipe, root)
            leftovers = run_dir.outputs(root)
            log(f"--resume: no checkpoint in {root}; starting afresh"
                + (f" (the run stopped before its first checkpoint; replacing its "
                   f"{', '.join(p.name for p in leftovers)})" if leftovers else ""))
        run_dir.claim(root, overwrite or resume, lambda text: None if resume else log(text))
        return None, []
    return found, compare(recipe, found, log)
