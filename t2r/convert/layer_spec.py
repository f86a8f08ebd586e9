"""Which layers to convert: the one grammar of a `layers` spec, for `t2r.convert`, `t2r convert --layers` and
a recipe's `convert.layers`.

A spec is None (every layer), an iterable of layer indices, or a string: a comma-separated list of indices and
inclusive ranges ("0-11,15,-1"; a negative index counts from the end), or `auto:N`, which keeps the N layers
most sensitive to conversion as softmax and converts the rest (`t2r.convert.sensitivity` ranks them).
"""

from __future__ import annotations

import re

_ITEM = r"\s*(?:-?\d+|\d+\s*-\s*\d+)\s*"
LAYER_LIST = re.compile(rf"{_ITEM}(?:,{_ITEM})*,?\s*")
"""A string of indices and ranges: "0-11,15,-1" (a trailing comma and spaces allowed)."""
AUTO_LAYERS = re.compile(r"\s*auto:(\d+)\s*")
"""`auto:N`: keep the N most sensitive layers as softmax, convert the rest."""
SPEC_HELP = "a layer list like '0-11,15,-1' or 'auto:N' (keep the N most sensitive layers softmax)"


def auto_softmax_count(spec) -> int | None:
    """N of an `auto:N` layers spec, or None for any other spec."""
    match = AUTO_LAYERS.fullmatch(spec) if isinstance(spec, str) else None
    return int(match.group(1)) if match else None


def check_layer_spec(spec: str) -> None:
    """ValueError unless the string `spec` is a layer list or `auto:N`."""
    if not (LAYER_LIST.fullmatch(spec) or AUTO_LAYERS.fullmatch(spec)):
        raise ValueError(f"{spec!r} is not {SPEC_HELP}")


def parse_layers(spec, num_layers: int) -> list[int]:
    """Sorted layer indices in [0, num_layers) from `None` (all), an iterable of ints, or a string like "0-3,8,-1".
    `auto:N` is resolved by ranking the layers first (`t2r.convert.calibrated_convert`)."""
    if spec is None:
        return list(range(num_layers))
    if isinstance(spec, str):
        if auto_softmax_count(spec) is not None:
            raise ValueError(f"layers={spec!r} needs the layers ranked on sample text first: use "
                             "t2r.convert.calibrated_convert (or t2r.convert.resolve_layers), not convert")
        check_layer_spec(spec)
        spec = [index for part in filter(None, (p.strip() for p in spec.split(","))) for index in _indices(part)]
    resolved = []
    for i in spec:
        if not -num_layers <= int(i) < num_layers:
            raise ValueError(f"layer index {i} is out of range for a model with {num_layers} layers")
        resolved.append(int(i) % num_layers)
    if not resolved:
        raise ValueError("layers= selects no layer; pass None to convert every layer")
    return sorted(set(resolved))


def _indices(part: str) -> list[int]:
    """One item of a layer list: "7", "-1" or the inclusive range "3-5"."""
    if "-" in part[1:]:
        low, high = part.split("-", 1)
        return list(range(int(low), int(high) + 1))
    return [int(part)]


def compact_ranges(indices: list[int]) -> str:
    """The shortest layer list for sorted `indices`: [0, 1, 2, 5] -> "0-2,5" (`parse_layers` reads it back)."""
    parts, start = [], None
    for i, x in enumerate(indices):
        start = x if start is None else start
        if i + 1 == len(indices) or indices[i + 1] != x + 1:
            parts.append(str(start) if start == x else f"{start}-{x}")
            start = None
    return ",".join(parts)
