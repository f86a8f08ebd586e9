"""`t2r convert` and `t2r rank-layers` flags, generated from `t2r.convert.settings.ConvertSettings` and from the
options classes of the registered mixers (`t2r.layers.options`): help, choices, bounds and defaults come from
the fields, so none is restated here. Imports no torch (`t2r convert --help` answers at once).
"""

from __future__ import annotations

import argparse
import typing
from dataclasses import fields

from t2r.cli.flags import add_setting_flag, kind

CONVERT_COMMAND_SETTINGS = {
    "convert": ("target", "layers", "kept_window", "init", "data", "calibration_rows", "calibration_length", "rank_by",
                "rank_sweep"),
    "rank-layers": ("target", "data", "calibration_rows", "calibration_length", "rank_by", "rank_sweep"),
}
"""The `ConvertSettings` fields each command takes a flag for, in --help order (the mixer options follow)."""


def mixer_registry():
    """`t2r.layers.registry` (targets and their options): no torch, so building the parser stays instant."""
    from t2r.layers import registry

    return registry


def _text(value) -> str:
    if isinstance(value, bool) or value is None:
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


def option_default(registry, name: str) -> str:
    """`gsa; default 64`, or per target: `default: false for gsa, gla; true for fox` (each registered target
    that has the option, from its options class)."""
    per_target: dict[str, list[str]] = {}
    for spec in registry.MIXERS.values():
        if name in spec.options.field_names():
            per_target.setdefault(_text(getattr(spec.options(), name)), []).append(spec.name)
    targets = [t for ts in per_target.values() for t in ts]
    if len(per_target) == 1:
        value = next(iter(per_target))
        return f"default {value}" if len(targets) == len(registry.MIXERS) else f"{', '.join(targets)}; default {value}"
    return "default: " + "; ".join(f"{value} for {', '.join(ts)}" for value, ts in per_target.items())


def add_mixer_options(parser: argparse.ArgumentParser) -> None:
    """One flag per option of any registered mixer (`--num-slots`, `--rope`, ...), unset unless given; help,
    choices, bounds and defaults come from the options dataclasses."""
    registry = mixer_registry()
    for name in registry.option_names():
        field = registry.option_field(name)
        add_setting_flag(parser, field, kind(field.type), suffix=option_default(registry, name),
                         optional_bool=False, metavars=False)


def mixer_options(args) -> dict:
    """The mixer options given on the command line, by name."""
    return {name: getattr(args, name) for name in mixer_registry().option_names() if getattr(args, name) is not None}


def add_convert_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """The `ConvertSettings` flags of `command` (`convert` or `rank-layers`), each defaulting to its field's
    default, then the mixer options (unset unless given: each target has its own defaults)."""
    from t2r.convert.settings import ConvertSettings, help_text

    hints = typing.get_type_hints(ConvertSettings)
    by_name = {f.name: f for f in fields(ConvertSettings)}
    for name in CONVERT_COMMAND_SETTINGS[command]:
        f = by_name[name]
        add_setting_flag(parser, f, kind(hints[name]), help=help_text(f.metadata), unset=False)
    add_mixer_options(parser)


def given_convert_settings(args, command: str) -> dict:
    """The `ConvertSettings` fields of `command`'s flags, by name."""
    return {name: getattr(args, name) for name in CONVERT_COMMAND_SETTINGS[command]}
