"""What a conversion is asked for: `ConvertSettings`, one `t2r.settings.setting` per setting.

A recipe's `convert:` section is a `ConvertSettings` (`t2r.train.recipe.ConvertSection`); `t2r convert` and
`t2r rank-layers` generate their flags from its fields (`t2r.cli.flags`), and `calibrated_convert` takes its
defaults from it, so each default lives here only. The mixer options (`options`) are declared by each target's
options class (`t2r.layers.options`). Imports no torch: `t2r convert --help` and recipe checks read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from t2r.layers.registry import MIXERS, get_mixer, teacher_init_targets
from t2r.ranking import CRITERIA, SWEEPS
from t2r.settings import check_settings, defaults, setting

BASELINE = "none"
"""`target` of a recipe that finetunes the source model unconverted (a baseline)."""
INITS = ("default", "teacher")


def targets() -> tuple[str, ...]:
    """The registered mixers (read when asked, so mixers registered later count)."""
    return tuple(MIXERS)


def recipe_targets() -> tuple[str, ...]:
    """A recipe's `convert.target` choices: the registered mixers, or `none`."""
    return (*MIXERS, BASELINE)


@dataclass
class ConvertSettings:
    """The target, the layers, the mixer options and how they are measured (ranking, teacher init)."""

    target: str = setting(help="the mixer that replaces softmax attention", choices=recipe_targets,
                          flag="--to", flag_choices=targets)
    layers: str | None = setting(
        None, "layers to convert, e.g. '0-11,15'; 'auto:N' keeps the N layers most sensitive to "
              "conversion as softmax (ranked as by rank-layers; the ranking is saved beside the model)",
        default_text="all")
    options: dict = setting({}, "fields of the target's options class (num_slots, feature_map, ...): in a recipe "
                                "a mapping, on the command line one flag each", flag=False)
    kept_window: int | None = setting(
        None, "the layers `layers` leaves softmax become the target too, attending over their last N tokens (and "
              "the target's sinks) beside its state instead of the whole context: every layer's memory is then "
              "constant (the target needs a window option)", default_text="none: kept layers stay full softmax",
        gt=0, max=2**20)
    rank_by: str = setting(
        "kl", "what --layers auto:N ranks by: kl (text), recall (MQAR answers), halo (recall cost over KL, HALO's "
              "retrieval/commonsense ratio) or kl+recall", choices=CRITERIA)
    rank_sweep: str = setting(
        "convert-one", "convert-one: each layer's cost converted alone; keep-one: what keeping it softmax buys back "
                       "with all others converted (finds where retrieval lives)", choices=SWEEPS)
    init: str = setting(
        "default", "teacher: start each new forget gate at the decay matching how far back the source's attention "
                   "head looks on the calibration text ({teacher})", choices=INITS)
    data: str | None = setting(
        None, "text to measure the source on, for --layers auto:N and --init teacher (file, directory or hub "
              "dataset); use text like the finetuning data", default_text="generated long documents", recipe=False)
    calibration_rows: int = setting(4, "rows of text for ranking and teacher init", gt=0, max=4096)
    calibration_length: int = setting(512, "tokens per calibration row (in a recipe, at most data.seq_len)", gt=0,
                                      max=2**20)

    def __post_init__(self):
        check_settings(self)
        check_kept_window(self.target, self.layers, self.kept_window)

    def mixer_options(self):
        """The target's options (`t2r.layers.options`) with `options` applied; a ValueError names a bad one."""
        return get_mixer(self.target).resolve_options(**self.options)


def check_kept_window(target: str, layers, kept_window: int | None) -> None:
    """ValueError naming the fix when `kept_window` cannot apply: every layer converted, or a target without a
    `window` option."""
    if kept_window is None or target == BASELINE:
        return
    if layers is None:
        raise ValueError(f"kept_window={kept_window} bounds the layers left softmax, but layers converts every "
                         "layer: give layers as auto:N or a list that leaves some softmax")
    if "window" not in get_mixer(target).options.field_names():
        windowed = ", ".join(t for t, spec in MIXERS.items() if "window" in spec.options.field_names())
        raise ValueError(f"kept_window needs a target with a window option; {target} has none "
                         f"(choose one of {windowed})")


def help_text(meta) -> str:
    """A field's help, with what the registry says filled in (`{teacher}`: the targets `init=teacher` serves)."""
    return meta["help"].replace("{teacher}", ", ".join(teacher_init_targets()))


CONVERT_DEFAULTS = defaults(ConvertSettings)
"""Every default of `ConvertSettings` by field name (`target` has none)."""
