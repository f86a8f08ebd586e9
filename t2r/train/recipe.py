"""Finetuning recipes: one YAML file (plus `section.field=value` overrides) -> a validated `Recipe`.

Validation is generic over the dataclass fields and their type hints (`t2r.train.fields`), per-field limits
(`RULES` on each section) and a few cross-field checks (`_check_recipe`); all of it runs before
`load_recipe` returns, and every `RecipeError` names the field path and what to change.
"""

from __future__ import annotations

import importlib.util
import os
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import ClassVar, Sequence

import yaml

from t2r.convert.layer_spec import check_layer_spec
from t2r.data.config import DataConfig
from t2r.dtypes import DTYPE_NAMES
from t2r.eval.suite import HELD_OUT, EvalSettings
from t2r.layers import MIXERS, get_mixer
from t2r.layers.registry import teacher_init_targets
from t2r.paths import check_model_spec, is_local

from .fields import RecipeError, build, coerce, plain, suggest
from .stages import check_stages, find_stage



class _Targets:
    """`convert.target` choices: the registered mixers (read when checked, so registered ones count) or none."""

    def __iter__(self):
        return iter((*MIXERS, "none"))

    def __contains__(self, name) -> bool:
        return name in MIXERS or name == "none"


TARGETS = _Targets()
DTYPES = DTYPE_NAMES
SCHEDULES = ("cosine", "linear", "constant")
MIXED_PRECISION = ("bf16", "fp16", "no")
TRAINABLE = ("all", "attention", "gates", "lora")
TRACKERS = ("tensorboard", "wandb")
TRACKER_PACKAGES = {"tensorboard": ("tensorboard", "tensorboardX"), "wandb": ("wandb",)}
"""The packages accelerate looks for to run each tracker (any one of them)."""


@dataclass
class ModelSection:
    source: str  # hub id, local directory, file.gguf, or "smollm2"
    dtype: str = "bfloat16"  # dtype the source is loaded in
    RULES: ClassVar[dict] = {"source": {"nonempty": True}, "dtype": {"choices": DTYPES}}


@dataclass
class ConvertSection:
    target: str  # a registered mixer (gsa, gla, retnet, fox), or "none" to finetune the source model (baseline)
    layers: str | None = None
    """Layers to convert, e.g. "0-15,20" (default: all); "auto:N" keeps the N layers most sensitive to conversion
    as softmax, ranked on the training text (`t2r rank-layers`; the ranking is saved in <checkpoint.dir>)."""
    options: dict = field(default_factory=dict)  # t2r.convert(..., **options): num_slots, feature_map, ...
    init: str = "default"
    """The new forget gates' start: default, or teacher (each head's decay from how far back the source's
    attention looks on the training text, `t2r.convert.lookback`; targets with `MixerSpec.teacher_init`)."""
    RULES: ClassVar[dict] = {"target": {"choices": TARGETS}, "init": {"choices": ("default", "teacher")}}


@dataclass
class DataSection(DataConfig):
    """`t2r.data.DataConfig` plus how documents become training sequences."""

    seq_len: int = 2048
    document_boundaries: bool = True  # reset the state / mask attention at document starts
    RULES: ClassVar[dict] = {
        "path": {"nonempty": True}, "held_out": {"min": 0}, "shuffle_buffer": {"min": 0},
        "max_documents": {"min": 1}, "seq_len": {"min": 2},  # one token per row leaves nothing to predict
    }

    def data_config(self) -> DataConfig:
        return DataConfig(**{f.name: getattr(self, f.name) for f in fields(DataConfig)})


@dataclass
class TrainSection:
    tokens_per_step: int  # global batch in tokens (all devices, all accumulation steps)
    lr: float = 3e-5
    min_lr_ratio: float = 0.1  # final lr = lr * min_lr_ratio (cosine, linear)
    warmup_steps: int = 1000
    schedule: str = "cosine"
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float | None = 1.0
    micro_batch_size: int = 1  # sequences per device per forward
    max_steps: int | None = None  # exactly one of max_steps / max_tokens
    max_tokens: int | None = None
    seed: int = 0
    mixed_precision: str = "bf16"
    gradient_checkpointing: bool = False
    trainable: str = "all"
    max_nonfinite_steps: int = 10  # skip steps with a nan/inf loss or gradient norm; stop after this many in a row
    RULES: ClassVar[dict] = {
        "tokens_per_step": {"min": 1}, "lr": {"gt": 0}, "min_lr_ratio": {"min": 0, "max": 1},
        "warmup_steps": {"min": 0}, "schedule": {"choices": SCHEDULES}, "weight_decay": {"min": 0},
        "betas": {"min": 0, "lt": 1}, "grad_clip": {"gt": 0}, "micro_batch_size": {"min": 1},
        "max_steps": {"min": 1}, "max_tokens": {"min": 1}, "seed": {"min": 0},
        "mixed_precision": {"choices": MIXED_PRECISION}, "trainable": {"choices": TRAINABLE},
        "max_nonfinite_steps": {"min": 1},
    }

    @property
    def total_steps(self) -> int:
        return self.max_steps if self.max_steps is not None else self.max_tokens // self.tokens_per_step


@dataclass
class LoraSection:
    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: list[str] | None = None
    """Modules that get adapters; default: the attention projections the source has (q_proj, k_proj, v_proj,
    o_proj, or Phi-3's fused qkv_proj)."""
    RULES: ClassVar[dict] = {"r": {"min": 1}, "alpha": {"min": 1}, "dropout": {"min": 0, "lt": 1},
                             "target_modules": {"nonempty": True}}


@dataclass
class AttentionTransferSection:
    """Train the new layers to match each source attention layer's output (LoLCATs-style)."""

    steps: int
    lr: float = 1e-3
    params: str = "attention"  # attention: q/k/v/o and the new gates; gates: the new gates only (pretrained q/k/v/o kept)
    RULES: ClassVar[dict] = {"steps": {"min": 1}, "lr": {"gt": 0}, "params": {"choices": ("attention", "gates")}}


@dataclass
class DistillSection:
    weight: float = 1.0  # loss = weight * KL(source || model) + (1 - weight) * next-token loss
    temperature: float = 1.0
    RULES: ClassVar[dict] = {"weight": {"min": 0, "max": 1}, "temperature": {"gt": 0}}


@dataclass
class StagesSection:
    attention_transfer: AttentionTransferSection | None = None
    distill: DistillSection | None = None


@dataclass
class StageSection:
    """One entry of a stage list (`t2r.train.stages`); a field left unset takes the `train:` (or `data:`) value."""

    name: str  # unique: metrics rows, console lines and checkpoint names (step-N-<name>)
    loss: str | dict = "next_token"  # next_token | kl | attention_mse, or a weighted mix {kl: 0.9, next_token: 0.1}
    steps: int | None = None  # exactly one of steps / tokens (default: train.max_steps / train.max_tokens)
    tokens: int | None = None
    lr: float | None = None
    warmup_steps: int | None = None
    schedule: str | None = None
    min_lr_ratio: float | None = None
    trainable: str | None = None
    seq_len: int | None = None  # default data.seq_len
    micro_batch_size: int | None = None
    temperature: float = 1.0  # of the kl loss
    RULES: ClassVar[dict] = {
        "name": {"nonempty": True}, "steps": {"min": 1}, "tokens": {"min": 1}, "lr": {"gt": 0},
        "warmup_steps": {"min": 0}, "schedule": {"choices": SCHEDULES}, "min_lr_ratio": {"min": 0, "max": 1},
        "trainable": {"choices": TRAINABLE}, "seq_len": {"min": 2}, "micro_batch_size": {"min": 1},
        "temperature": {"gt": 0},
    }

    def num_steps(self, tokens_per_step: int) -> int:
        return self.steps if self.steps is not None else self.tokens // tokens_per_step


@dataclass
class CheckpointSection:
    dir: str = "runs/{name}"  # {name} is replaced by the recipe name
    every_steps: int = 500
    keep_last: int = 2  # 0: only the newest while training, none once final/ is written (no --resume after)
    RULES: ClassVar[dict] = {"dir": {"nonempty": True}, "every_steps": {"min": 1}, "keep_last": {"min": 0}}


@dataclass
class LoggingSection:
    every_steps: int = 10
    trackers: list[str] = field(default_factory=list)
    plot: bool = True  # write loss / lr curves as PNG next to the checkpoints
    RULES: ClassVar[dict] = {"every_steps": {"min": 1}, "trackers": {"choices": TRACKERS}}


@dataclass
class Recipe:
    name: str
    model: ModelSection
    convert: ConvertSection
    data: DataSection
    train: TrainSection
    lora: LoraSection | None = None
    stages: StagesSection | list[StageSection] = field(default_factory=StagesSection)
    """Either the fixed sections (attention_transfer before the main loop, distill in it) or a list of stages
    run in order (`t2r.train.stages`)."""
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    logging: LoggingSection = field(default_factory=LoggingSection)
    eval: EvalSettings | None = None
    """What `t2r run` measures after finetuning (fields of `t2r.eval.EvalSettings`); none: perplexity by
    position only."""
    RULES: ClassVar[dict] = {"name": {"nonempty": True}}

    @property
    def staged(self) -> bool:
        """True for a list of stages."""
        return isinstance(self.stages, list)

    @property
    def needs_teacher(self) -> bool:
        """True when some stage compares against the unconverted source (kl, attention MSE)."""
        if self.staged:
            return any(set(stage.loss) & {"kl", "attention_mse"} for stage in self.stages)
        return self.stages.distill is not None or self.stages.attention_transfer is not None

    @property
    def total_steps(self) -> int:
        if self.staged:
            return sum(stage.num_steps(self.train.tokens_per_step) for stage in self.stages)
        return self.train.total_steps

    def grad_accum_steps(self, num_processes: int = 1) -> int:
        """Micro-batches per optimizer step on each of `num_processes` devices."""
        per_micro = self.data.seq_len * self.train.micro_batch_size * num_processes
        steps, rest = divmod(self.train.tokens_per_step, per_micro)
        if num_processes < 1 or rest or steps < 1:
            raise RecipeError(
                f"train.tokens_per_step: {self.train.tokens_per_step} tokens is not a positive multiple of "
                f"data.seq_len ({self.data.seq_len}) x train.micro_batch_size ({self.train.micro_batch_size}) x "
                f"{num_processes} process(es) = {per_micro}; change one of them "
                f"(e.g. train.tokens_per_step={max(1, round(self.train.tokens_per_step / per_micro)) * per_micro})")
        return steps

    def to_dict(self) -> dict:
        return plain(self)




def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a parent that is not a package; a module without a spec
        return False


def check_gates(recipe: Recipe, where: str) -> None:
    """`trainable: gates` needs a target that adds gates (or a window, whose gain counts, even in retnet)."""
    convert = recipe.convert
    windowed = bool((convert.options or {}).get("window"))
    if convert.target == "none" or not (get_mixer(convert.target).adds_parameters or windowed):
        raise RecipeError(f"{where}: 'gates' trains the new gates, and target {convert.target!r} adds none; "
                          f"use {where}=attention or all")


def _check_recipe(recipe: Recipe, check_files: bool) -> None:
    train, convert = recipe.train, recipe.convert
    if (train.max_steps is None) == (train.max_tokens is None) and not (recipe.staged and train.max_steps is None):
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
        for bad, what in ((convert.layers is not None, "convert.layers"), (bool(convert.options), "convert.options"),
                          (not recipe.staged and recipe.stages.attention_transfer is not None,
                           "stages.attention_transfer")):
            if bad:
                raise RecipeError(f"{what}: needs converted layers, but convert.target is 'none' (baseline)")
    else:
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
    if recipe.staged:
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
        from t2r.data.documents import local_files

        try:  # one rule for local paths vs hub ids (t2r.paths): a missing local path fails here, by name
            check_model_spec(recipe.model.source)
        except FileNotFoundError as err:
            raise RecipeError(f"model.source: {err}") from None
        try:
            if is_local(recipe.data.path):
                local_files(os.path.expanduser(recipe.data.path))  # a supported format, as the loader reads it
        except (FileNotFoundError, ValueError) as err:
            raise RecipeError(f"data.path: {err}") from None


def recipe_from_dict(data: dict, check_files: bool = True) -> Recipe:
    """Validate a plain mapping (as read from YAML) into a Recipe."""
    if not isinstance(data, dict):
        raise RecipeError(f"recipe: expected a mapping of sections, got {type(data).__name__}")
    recipe = build(Recipe, data)
    recipe.checkpoint.dir = recipe.checkpoint.dir.replace("{name}", recipe.name)
    _check_recipe(recipe, check_files)
    return recipe


def apply_override(data: dict, override: str) -> None:
    """Set `section.field=value` (value read as YAML) in the raw mapping, creating sections as needed."""
    key, sep, text = override.partition("=")
    key = key.strip()
    if not sep or not key:
        raise RecipeError(f"override {override!r}: expected section.field=value, e.g. train.lr=1e-4")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = text
    parts, node = key.split("."), data
    for i, part in enumerate(parts[:-1]):
        if isinstance(node, list):  # a stage list: the part is a stage's name (stages.align.lr=1e-3) or index
            node = node[find_stage(node, part, ".".join(parts[:i]))]
            continue
        if node.get(part) is None:
            node[part] = {}
        elif not isinstance(node[part], (dict, list)):
            raise RecipeError(f"{'.'.join(parts[:i + 1])}: is a value, not a section (override {override!r})")
        node = node[part]
    if isinstance(node, list):
        raise RecipeError(f"{key}: is a stage, not a field (override {override!r}; e.g. {key}.lr=1e-4)")
    node[parts[-1]] = value


def load_recipe(path: str | os.PathLike | None = None, overrides: Sequence[str] = (),
                check_files: bool = True) -> Recipe:
    """Read a YAML recipe (the recipe name defaults to the file's stem), apply overrides, validate."""
    data: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise RecipeError(f"recipe file {str(path)!r} does not exist")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as err:
            raise RecipeError(f"recipe file {str(path)!r} is not valid YAML: {err}") from None
        if not isinstance(data, dict):
            raise RecipeError(f"recipe file {str(path)!r}: expected a mapping of sections at the top level")
        data.setdefault("name", path.stem)
    if isinstance(overrides, str):
        overrides = [overrides]
    for override in overrides:
        apply_override(data, override)
    return recipe_from_dict(data, check_files=check_files)


def save_resolved(recipe: Recipe, directory: str | os.PathLike) -> Path:
    """Write the fully resolved recipe (all defaults filled in) to `directory/recipe.yaml`."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "recipe.yaml"
    path.write_text(f"# resolved recipe {recipe.name!r}: all defaults filled in\n"
                    + yaml.safe_dump(recipe.to_dict(), sort_keys=False))
    return path
