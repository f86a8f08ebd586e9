"""The one way a setting is declared: a dataclass field made by `setting(...)`, carrying its help, choices and
bounds as metadata, checked by `check_value` (finite numbers, bounds, choices).

`t2r.eval.settings.EvalSettings`, `t2r.convert.settings.ConvertSettings` and the mixer options of
`t2r.layers.options` declare their fields this way; recipes validate them (`t2r.train.fields`) and the command
line generates their flags (`t2r.cli.flags`) from the same metadata. Imports nothing of t2r, nor torch.
"""

from __future__ import annotations

import math
import operator
from dataclasses import MISSING, field, fields, is_dataclass

BOUNDS = {"min": (operator.ge, ">="), "gt": (operator.gt, ">"), "max": (operator.le, "<="), "lt": (operator.lt, "<")}
"""Bound keys of a setting's metadata: (test, symbol)."""
RULE_KEYS = ("choices", *BOUNDS)

SEED_MAX = 2**32 - 1
"""The largest seed torch and numpy take (a larger one failed after training, in their words, naming no setting)."""
COUNT_MAX = 2**16
"""Upper bound of counts held at once (rows of a batch, prompts, a LoRA rank): beyond it, an allocation no machine
has (`lora.r: 1e30` failed in torch's C++ with a traceback)."""
LENGTH_MAX = 2**24
"""Upper bound of tokens in a row, window or context (16M)."""
STEPS_MAX = 2**40
"""Upper bound of steps, tokens per step and documents: more never ends (`tokens_per_step: 1e30` overflowed only
once training started)."""
TOKENS_MAX = 2**53
"""Upper bound of token budgets: integers written as floats are exact up to here (1e30 reads as
1000000000000000019884624838656)."""


def setting(default=MISSING, help: str = "", group: str | None = None, **meta):
    """A field whose `help` becomes its flag's text; a list default is copied for each instance; no default:
    a required field. Extra metadata: `choices` (a tuple, or a function returning one, read when checked),
    `min`/`gt`/`max`/`lt` (bounds of a number, or of each item of a list), `default_text` (the default as
    `--help` words it), `flag` (the flag's name, if not `--field-name`; False: no flag)."""
    if isinstance(default, list):
        kwargs = {"default_factory": lambda: list(default)}
    elif isinstance(default, dict):
        kwargs = {"default_factory": lambda: dict(default)}
    else:
        kwargs = {} if default is MISSING else {"default": default}
    return field(**kwargs, metadata={"help": help, "group": group, **meta})


def choices_of(meta) -> tuple | None:
    """The allowed values a setting's metadata names, or None."""
    choices = meta.get("choices")
    return tuple(choices()) if callable(choices) else choices


def rules_of(meta) -> dict:
    """The checks a setting's metadata declares (choices and bounds), as a `RULES` entry of `t2r.train.fields`."""
    rules = {key: meta[key] for key in BOUNDS if key in meta}
    if meta.get("choices") is not None:
        rules["choices"] = choices_of(meta)
    return rules


def field_meta(cls, name: str):
    """The metadata of field `name` of dataclass `cls`: a subclass that redeclares a field with a plain default
    (`feature_map: str = "swish"`) keeps the help, choices and bounds of the class that declared it."""
    for klass in cls.__mro__:
        found = getattr(klass, "__dataclass_fields__", {}).get(name)
        if found is not None and found.metadata:
            return found.metadata
    return {}


def _either(choices) -> str:
    words = [str(c) for c in choices]
    return f": choose {' or '.join(words)}" if len(words) == 2 else f" is not one of {', '.join(words)}"


def _bound_words(key: str, bound, integer: bool) -> str:
    if key == "gt" and bound == 0:
        return "a positive integer" if integer else "a positive number"
    return f"{'an integer' if integer else 'a number'} {BOUNDS[key][1]} {bound}"


def check_value(name: str, value, meta) -> None:
    """Raise ValueError (one line, naming `name`) unless `value` (or each item of a list) is a finite number
    within the metadata's bounds and one of its choices; None passes (an unset optional)."""
    rules = rules_of(meta)
    for item in value if isinstance(value, (list, tuple)) else [value]:
        if item is None:
            continue
        choices = rules.get("choices")
        if choices is not None and item not in choices:
            raise ValueError(f"{name}={item!r}{_either(choices)}")
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            continue
        if isinstance(item, float) and not math.isfinite(item):
            raise ValueError(f"{name} must be a finite number, got {item!r}")
        for key, (ok, _) in BOUNDS.items():
            if key in rules and not ok(item, rules[key]):
                shown = f"{item:g}" if isinstance(item, float) or abs(item) > 1e15 else str(item)
                raise ValueError(f"{name} must be {_bound_words(key, rules[key], isinstance(item, int))}, got {shown}")


def check_settings(settings) -> None:
    """`check_value` on every field of a dataclass instance, with the metadata that declares it."""
    for f in fields(settings):
        check_value(f.name, getattr(settings, f.name), field_meta(type(settings), f.name))


def default_of(f):
    """A field's default (a fresh copy for a factory); MISSING for a required field."""
    return f.default_factory() if f.default is MISSING and f.default_factory is not MISSING else f.default


def defaults(cls) -> dict:
    """Every field's default by name (required fields left out): what a function taking these settings as
    keywords uses instead of restating them."""
    assert is_dataclass(cls)
    return {f.name: default_of(f) for f in fields(cls) if default_of(f) is not MISSING}
