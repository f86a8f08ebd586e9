"""Command-line flags generated from settings declared by `t2r.settings.setting`: one flag per field, its help,
choices and default from the field, its value checked against the field's bounds as it is parsed.

A flag left out stays None, so the dataclass's default is the only one; `--help` shows it. `t2r.cli.eval_flags`
(EvalSettings), `t2r.cli.convert_flags` (ConvertSettings and the mixer options) use it.
"""

from __future__ import annotations

import argparse
import types
import typing
from dataclasses import MISSING

from t2r.cli import values
from t2r.settings import check_value, default_of

PARSERS = {"list[int]": (values.sizes, "N,N,..."), "list[float]": (values.floats, "X,X,..."),
           "list[str]": (values.names, "A,B,..."), "int": (values.count, "N"), "float": (float, "X"),
           "str": (str, None)}
"""(argparse type, metavar) per kind of field."""
NUMERIC = ("int", "float", "list[int]", "list[float]")


def kind(tp) -> str:
    """`list[int]`, `int`, `bool`, ... of a field's type hint (or its text), None dropped from an optional."""
    if isinstance(tp, str):
        return tp.removesuffix(" | None")
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        tp = next(t for t in typing.get_args(tp) if t is not type(None))
    if typing.get_origin(tp) is list:
        return f"list[{typing.get_args(tp)[0].__name__}]"
    return tp.__name__


def default_text(f, meta=None) -> str:
    """A field's default as `--help` words it (its `default_text`, else the value)."""
    meta = f.metadata if meta is None else meta
    if "default_text" in meta:
        return meta["default_text"]
    value = default_of(f)
    if isinstance(value, list):
        return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value) or "none"
    if isinstance(value, float):
        return f"{value:g}"
    return "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


PARSE_TIME_BOUNDS = ("max", "lt")
"""The bounds a flag's parser checks (with finiteness): a value no setting could mean (nan, 1e30) is an argparse
error. The lower bounds are checked once the settings are built from the flags (`ConvertSettings`,
`MixerOptions.validate`), still before anything loads, where the error reads as the Python API's does."""


def checked(parse, name: str, meta):
    """`parse`, then the setting's finiteness and upper bounds (`t2r.settings.check_value`): a bad value is an
    argparse error naming the setting, before anything loads."""
    upper = {key: meta[key] for key in PARSE_TIME_BOUNDS if key in meta}

    def parse_checked(text: str):
        value = parse(text)
        try:
            check_value(name, value, upper)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
        return value

    parse_checked.__name__ = getattr(parse, "__name__", name)  # argparse's "invalid <type> value" names it
    return parse_checked


def flag_kwargs(name: str, field_kind: str, meta, *, optional_bool: bool = True, metavars: bool = True) -> dict:
    """`add_argument` keywords of one setting: its parser (checked), metavar and choices."""
    if field_kind == "bool":
        kwargs = {"type": values.boolean, "metavar": "true|false"}
        if optional_bool:
            kwargs.update(nargs="?", const=True)
    else:
        parse, metavar = PARSERS[field_kind]
        kwargs = {"type": checked(parse, name, meta) if field_kind in NUMERIC else parse}
        if metavars:
            kwargs["metavar"] = metavar
    choices = meta.get("flag_choices", meta.get("choices"))
    if choices is not None:
        kwargs.update(choices=tuple(choices()) if callable(choices) else choices, metavar=None)
    return kwargs


def flag_name(name: str, meta=None) -> str:
    """`--field-name`, or the flag the field's metadata names."""
    return (meta or {}).get("flag") or "--" + name.replace("_", "-")


def add_setting_flag(container, f, field_kind: str, *, flag: str | None = None, help: str | None = None,
                     suffix: str | None = None, old: tuple = (), parser=None, unset: bool = True,
                     **options) -> None:
    """One flag for dataclass field `f` (default None, unset, or with `unset=False` the field's default), in
    `container` (a parser or argument group);
    `help` replaces the field's help, `suffix` the `default: ...` in parentheses after it; `old`: hidden
    earlier spellings, added to `parser`; `options`: of `flag_kwargs`."""
    meta = f.metadata
    kwargs = flag_kwargs(f.name, field_kind, meta, **options)
    required = f.default is MISSING and f.default_factory is MISSING
    text = help if help is not None else meta.get("help", f.name)
    if not required:
        text += f" ({f'default: {default_text(f)}' if suffix is None else suffix})"
    value = None if unset or required else default_of(f)
    container.add_argument(flag or flag_name(f.name, meta), dest=f.name, default=value, required=required,
                           help=text.replace("%", "%%"), **kwargs)
    for spelling in old:
        (parser or container).add_argument(spelling, dest=f.name, default=argparse.SUPPRESS, help=argparse.SUPPRESS,
                                           **kwargs)
