"""Validation of nested dataclasses from plain mappings (YAML): each value coerced to its field's type hint
(`coerce`), checked against the per-field limits a section lists in `RULES` (`check_rules`), and built
into the dataclass (`build`); every error is a `RecipeError` that starts with the field path. A field declared
by `t2r.settings.setting` brings its choices and bounds along; one with `recipe=False` (a command-line setting
only) is no recipe field."""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from dataclasses import MISSING, fields
from typing import Sequence

from t2r.settings import BOUNDS, rules_of


class RecipeError(ValueError):
    """A recipe that cannot run; the message starts with the offending field path."""


def suggest(word: str, options: Sequence[str], list_all: bool = True) -> str:
    match = difflib.get_close_matches(word, list(options), n=1)
    if match:
        return f"; did you mean {match[0]!r}?"
    return f"; expected one of {', '.join(options)}" if list_all else ""


_SCALARS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _scalar(value, tp):
    """`value` as bool/int/float/str, or None: ints pass as floats or strings, integral floats as ints (20e9),
    numeric strings as numbers (PyYAML reads 1e-4, without a dot, as a string); bools only as bools."""
    if isinstance(value, bool) or tp is bool:
        return value if tp is bool and isinstance(value, bool) else None
    if tp is str or (tp is int and isinstance(value, int)):
        return value if isinstance(value, (str, tp)) else str(value) if isinstance(value, int) else None
    try:
        number = float(value) if isinstance(value, (int, float, str)) else math.nan
    except ValueError:
        return None
    if not math.isfinite(number) or (tp is int and not number.is_integer()):
        return None
    return int(number) if tp is int else number


def _type_error(path: str, expected: str, value) -> RecipeError:
    return RecipeError(f"{path}: expected {expected}, got {value!r}")


def _branch(options: list, value):
    """The member of a union that `value` is written as: a list for a list hint, a mapping for a section or
    a dict hint, else the first scalar (`str | dict` takes "kl" as the string, `{kl: 1}` as the dict)."""
    def shape(tp):
        origin = typing.get_origin(tp)
        if origin in (list, tuple):
            return (list, tuple)
        return (dict,) if dataclasses.is_dataclass(tp) or tp is dict or origin is dict else None

    for tp in options:
        kinds = shape(tp)
        if kinds is not None and isinstance(value, kinds):
            return tp
    scalars = [tp for tp in options if shape(tp) is None]
    return (scalars or options)[0]


def coerce(value, tp, path: str):
    """`value` as type hint `tp`, or a RecipeError naming `path`."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        tp = _branch([a for a in args if a is not type(None)], value)
        origin, args = typing.get_origin(tp), typing.get_args(tp)
    if value is None:
        raise RecipeError(f"{path}: must be set (got null)")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise _type_error(path, "a section (field: value mapping)", value)
        return build(tp, value, path)
    if tp in _SCALARS:
        if (result := _scalar(value, tp)) is None:
            raise _type_error(path, _SCALARS[tp], value)
        return result
    if origin is list:
        value = [value] if isinstance(value, str) else value
        if not isinstance(value, (list, tuple)):
            raise _type_error(path, "a list", value)
        return [coerce(item, args[0], f"{path}[{i}]") for i, item in enumerate(value)]
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise _type_error(path, f"a list of {len(args)} items", value)
        return tuple(coerce(item, t, f"{path}[{i}]") for i, (item, t) in enumerate(zip(value, args)))
    if tp is dict or origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise _type_error(path, "a mapping of names to values", value)
        return dict(value)
    raise TypeError(f"{path}: unsupported field type {tp!r}")


BOOL_WORDS = {False: ("no", "off", "false"), True: ("yes", "on", "true")}
"""Words YAML 1.1 (PyYAML) reads as booleans when bare: `mixed_precision: no` arrives as False."""


def bool_word(value, choices):
    """A boolean back as the word it was written as, when `choices` (strings) hold one of its words:
    `train.mixed_precision=no` means the choice "no", not False."""
    if isinstance(value, bool) and choices:
        return next((word for word in BOOL_WORDS[value] if word in choices), value)
    return value


def check_rules(value, rules: dict, path: str) -> None:
    if value is None:
        return
    if rules.get("nonempty") and not value:
        raise RecipeError(f"{path}: must not be empty")
    for item in value if isinstance(value, (list, tuple)) else [value]:
        choices = rules.get("choices")
        if choices and item not in choices:
            raise RecipeError(f"{path}: {item!r} is not one of {', '.join(choices)}"
                              f"{suggest(str(item), choices, list_all=False)}")
        for key, (ok, word) in BOUNDS.items():
            if key in rules and not ok(item, rules[key]):
                shown = f"{item:g}" if isinstance(item, int) and abs(item) > 1e15 else repr(item)  # 1e30, not 31 digits
                raise RecipeError(f"{path}: must be {word} {rules[key]}, got {shown}")


def recipe_fields(cls) -> list:
    """The fields of dataclass `cls` a recipe sets (all but those declared with `recipe=False`)."""
    return [f for f in fields(cls) if f.metadata.get("recipe", True)]


def build(cls, data: dict, path: str = ""):
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in recipe_fields(cls)}
    join = (lambda name: f"{path}.{name}") if path else (lambda name: name)
    for key in data:
        if key not in known:
            if any(f.name == key for f in fields(cls)):
                raise RecipeError(f"{join(key)}: a command-line setting, not a recipe field; remove it")
            raise RecipeError(f"{join(key)}: unknown field{suggest(str(key), list(known))}")
    values = {}
    for name, f in known.items():
        if name not in data:
            if f.default is MISSING and f.default_factory is MISSING:
                kind = "section" if dataclasses.is_dataclass(hints[name]) else "field"
                raise RecipeError(f"{join(name)}: missing required {kind}")
            continue
        rules = {**rules_of(f.metadata), **getattr(cls, "RULES", {}).get(name, {})}
        values[name] = coerce(bool_word(data[name], rules.get("choices")), hints[name], join(name))
        check_rules(values[name], rules, join(name))
    try:
        return cls(**values)
    except ValueError as err:  # a section's own checks (EvalSettings.check)
        raise err if isinstance(err, RecipeError) else RecipeError(f"{path or 'recipe'}: {err}") from None


def plain(value):
    if dataclasses.is_dataclass(value):
        return {f.name: plain(getattr(value, f.name)) for f in recipe_fields(value)}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value
