"""Finetuning recipes: one YAML file (plus `section.field=value` overrides) -> a validated `Recipe`.

Validation is generic over the dataclass fields and their type hints (`t2r.train.fields`), per-field limits
(`RULES` on each section) and the cross-field checks of `t2r.train.checks`; all of it runs before
`load_recipe` returns, and every `RecipeError` names the field path and what to change.

Training is a list of stages (`stages:`, run by `t2r.train.stages`); a recipe without one trains one stage
from `train:` (next-token loss), and the older mapping form (`stages: {distill: ...}`) is read into a list.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import ClassVar, Sequence

import yaml

from t2r.convert.settings import ConvertSettings
from t2r.data.config import DataConfig
from t2r.dtypes import DTYPE_NAMES
from t2r.eval.settings import EvalSettings
from t2r.settings import COUNT_MAX, LENGTH_MAX, SEED_MAX, STEPS_MAX, TOKENS_MAX

from . import strict_yaml
from .checks import TEACHER_LOSSES, check_recipe, find_stage, stages_from_sections
from .fields import RecipeError, build, plain

IMPLICIT_STAGE = "train"
"""The name of the one stage of a recipe without `stages:`."""


DTYPES = DTYPE_NAMES
SCHEDULES = ("cosine", "linear", "constant")
MIXED_PRECISION = ("bf16", "fp16", "no")
TRAINABLE = ("all", "attention", "gates", "lora")
GRADIENT_SYNC = ("fp32", "bf16")
READERS = ("auto", "process", "thread")
TRACKERS = ("tensorboard", "wandb")


@dataclass
class ModelSection:
    source: str  # hub id, local directory, file.gguf, or "smollm2"
    dtype: str = "bfloat16"  # dtype the source is loaded in
    RULES: ClassVar[dict] = {"source": {"nonempty": True}, "dtype": {"choices": DTYPES}}


ConvertSection = ConvertSettings
"""The `convert:` section: `t2r.convert.settings.ConvertSettings` (target, layers, options, rank_by, rank_sweep,
init, calibration_rows, calibration_length; its command-line-only `data` is no recipe field: a recipe calibrates on
its own data), so `t2r convert` and recipes share one declaration."""


@dataclass
class DataSection(DataConfig):
    """`t2r.data.DataConfig` plus how documents become training sequences."""

    seq_len: int = 2048
    document_boundaries: bool = True  # reset the state / mask attention at document starts
    reader: str = "auto"
    """Where the training stream is tokenised and packed ahead of the step: auto (a process of its own beside a
    GPU, whose launching thread a reading thread would share the GIL with; a thread on the CPU), process, or
    thread (a tokenizer that cannot be pickled into another process). The micro-batches are the same."""
    RULES: ClassVar[dict] = {
        "path": {"nonempty": True}, "held_out": {"min": 0, "max": STEPS_MAX}, "reader": {"choices": READERS},
        "shuffle_buffer": {"min": 0, "max": LENGTH_MAX},
        "max_documents": {"min": 1, "max": STEPS_MAX}, "max_skipped": {"min": 0, "max": 1},
        "seq_len": {"min": 2, "max": LENGTH_MAX},  # one token per row leaves nothing to predict
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
    max_collapsed_steps: int = 5  # stop after this many collapsed steps in a row (t2r.train.guard.CollapseGuard)
    fused_kl: bool = True
    """A KL loss without either model's whole logits: chunk by chunk over tokens, fused with the output head
    (`t2r.train.kl`; equal to the plain loss up to rounding); false: the plain loss on whole logits. Under FSDP2
    too (the head's unit gathered, `t2r.train.losses.whole_weight`); not with soft-capped logits, where the plain
    loss runs."""
    gradient_sync: str = "fp32"
    """How data-parallel processes (DDP) average their gradients: fp32, or bf16 (torch's bf16 compression hook:
    half the bytes all-reduced, each process's gradient rounded to bf16 before the mean). Nothing changes on
    one process or under FSDP."""
    gradient_bucket_mb: int = 25
    """DDP's all-reduce bucket in MiB (torch's default 25): each bucket's all-reduce starts in the backward once its
    gradients are ready. Where the step is bound by launching kernels, the ranks meet at every bucket; a bucket
    larger than the gradients (e.g. 1024) makes one all-reduce at the backward's end. Nothing changes on one
    process or under FSDP."""
    collect_garbage: bool = True
    """Python's garbage collector run by the step loop at one point of each step, the same on every process
    (`t2r.train.collector`), instead of whenever its allocation counters say (a full collection mid-step stalls
    the host for 100+ ms, and under DDP every other process with it); false: Python's own collection."""
    compile: bool = False
    """Regional compilation of the student and the teacher (`t2r.models.compilation`: each decoder layer through
    torch.compile, one graph shared by the layers): faster steps after a first step that compiles."""
    RULES: ClassVar[dict] = {
        "tokens_per_step": {"min": 1, "max": STEPS_MAX}, "lr": {"gt": 0}, "min_lr_ratio": {"min": 0, "max": 1},
        "warmup_steps": {"min": 0, "max": STEPS_MAX}, "schedule": {"choices": SCHEDULES}, "weight_decay": {"min": 0},
        "betas": {"min": 0, "lt": 1}, "grad_clip": {"gt": 0}, "micro_batch_size": {"min": 1, "max": COUNT_MAX},
        "max_steps": {"min": 1, "max": STEPS_MAX}, "max_tokens": {"min": 1, "max": TOKENS_MAX},
        "seed": {"min": 0, "max": SEED_MAX}, "mixed_precision": {"choices": MIXED_PRECISION},
        "trainable": {"choices": TRAINABLE}, "max_nonfinite_steps": {"min": 1, "max": STEPS_MAX},
        "max_collapsed_steps": {"min": 1, "max": STEPS_MAX}, "gradient_sync": {"choices": GRADIENT_SYNC},
        "gradient_bucket_mb": {"min": 1, "max": 1 << 20},
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
    RULES: ClassVar[dict] = {"r": {"min": 1, "max": COUNT_MAX}, "alpha": {"min": 1, "max": COUNT_MAX},
                             "dropout": {"min": 0, "lt": 1},
                             "target_modules": {"nonempty": True}}


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
        "name": {"nonempty": True}, "steps": {"min": 1, "max": STEPS_MAX}, "tokens": {"min": 1, "max": TOKENS_MAX},
        "lr": {"gt": 0}, "warmup_steps": {"min": 0, "max": STEPS_MAX}, "schedule": {"choices": SCHEDULES},
        "min_lr_ratio": {"min": 0, "max": 1}, "trainable": {"choices": TRAINABLE},
        "seq_len": {"min": 2, "max": LENGTH_MAX}, "micro_batch_size": {"min": 1, "max": COUNT_MAX},
        "temperature": {"gt": 0},
    }

    def num_steps(self, tokens_per_step: int) -> int:
        return self.steps if self.steps is not None else self.tokens // tokens_per_step


@dataclass
class CheckpointSection:
    dir: str = "runs/{name}"  # {name} is replaced by the recipe name
    every_steps: int = 500
    keep_last: int = 2  # 0: only the newest while training, none once final/ is written (no --resume after)
    RULES: ClassVar[dict] = {"dir": {"nonempty": True}, "every_steps": {"min": 1, "max": STEPS_MAX},
                             "keep_last": {"min": 0, "max": STEPS_MAX}}


@dataclass
class LoggingSection:
    every_steps: int = 10
    trackers: list[str] = field(default_factory=list)
    plot: bool = True  # write loss / lr curves as PNG next to the checkpoints
    RULES: ClassVar[dict] = {"every_steps": {"min": 1, "max": STEPS_MAX}, "trackers": {"choices": TRACKERS}}


@dataclass
class Recipe:
    name: str
    model: ModelSection
    convert: ConvertSection
    data: DataSection
    train: TrainSection
    lora: LoraSection | None = None
    stages: list[StageSection] | None = None
    """Stages run in order (`t2r.train.stages`); none: one stage from `train:` with the next-token loss."""
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    logging: LoggingSection = field(default_factory=LoggingSection)
    eval: EvalSettings | None = None
    """What `t2r run` measures after finetuning (fields of `t2r.eval.EvalSettings`); none: perplexity by
    position only."""
    RULES: ClassVar[dict] = {"name": {"nonempty": True}}

    @property
    def stage_list(self) -> list[StageSection]:
        """The stages this recipe trains: its own list, or the one stage `train:` describes (unnamed in
        checkpoints and metrics, as recipes without stages always were)."""
        if self.stages is not None:
            return self.stages
        train = self.train
        return [StageSection(name=IMPLICIT_STAGE, loss={"next_token": 1.0}, steps=train.max_steps,
                             tokens=train.max_tokens, lr=train.lr, warmup_steps=train.warmup_steps,
                             schedule=train.schedule, min_lr_ratio=train.min_lr_ratio, trainable=train.trainable,
                             seq_len=self.data.seq_len, micro_batch_size=train.micro_batch_size)]

    @property
    def needs_teacher(self) -> bool:
        """True when some stage compares against the unconverted source (kl, attention MSE)."""
        return needs_teacher(self.stage_list)

    @property
    def total_steps(self) -> int:
        return sum(stage.num_steps(self.train.tokens_per_step) for stage in self.stage_list)

    def grad_accum_steps(self, num_processes: int = 1, stage: StageSection | None = None) -> int:
        """Micro-batches per optimizer step on each of `num_processes` devices (of `stage`, with its sequence length
        and micro-batch)."""
        seq_len, micro = ((stage.seq_len, stage.micro_batch_size) if stage is not None else
                          (self.data.seq_len, self.train.micro_batch_size))
        named = f"stages.{stage.name}." if stage is not None and self.stages is not None else None
        per_micro = seq_len * micro * num_processes
        steps, rest = divmod(self.train.tokens_per_step, per_micro)
        if num_processes < 1 or rest or steps < 1:
            raise RecipeError(
                f"train.tokens_per_step: {self.train.tokens_per_step} tokens is not a positive multiple of "
                f"{named or 'data.'}seq_len ({seq_len}) x {named or 'train.'}micro_batch_size ({micro}) x "
                f"{num_processes} process(es) = {per_micro}; change one of them "
                f"(e.g. train.tokens_per_step={max(1, round(self.train.tokens_per_step / per_micro)) * per_micro})")
        return steps

    def to_dict(self) -> dict:
        return plain(self)


def needs_teacher(stages: Sequence[StageSection]) -> bool:
    """True when one of `stages` weighs a loss against the unconverted source (kl, attention MSE) above 0."""
    return any(stage.loss.get(loss) for stage in stages for loss in TEACHER_LOSSES)


def recipe_from_dict(data: dict, check_files: bool = True) -> Recipe:
    """Validate a plain mapping (as read from YAML) into a Recipe."""
    if not isinstance(data, dict):
        raise RecipeError(f"recipe: expected a mapping of sections, got {type(data).__name__}")
    if isinstance(data.get("stages"), dict):  # the older mapping form, with the same meaning
        data = {**data, "stages": stages_from_sections(data["stages"], data)}
    recipe = build(Recipe, data)
    recipe.checkpoint.dir = recipe.checkpoint.dir.replace("{name}", recipe.name)
    check_recipe(recipe, check_files)
    return recipe


def apply_override(data: dict, override: str) -> None:
    """Set `section.field=value` (value read as YAML) in the raw mapping, creating sections as needed."""
    key, sep, text = override.partition("=")
    key = key.strip()
    if not sep or not key:
        raise RecipeError(f"override {override!r}: expected section.field=value, e.g. train.lr=1e-4")
    try:
        value = strict_yaml.load(text)
    except strict_yaml.DuplicateKeyError as err:
        raise RecipeError(f"override {override!r}: {err}") from None
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
            data = strict_yaml.load(path.read_text()) or {}
        except strict_yaml.DuplicateKeyError as err:
            raise RecipeError(f"recipe file {str(path)!r}: {err}") from None
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
