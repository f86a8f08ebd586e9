"""Argument value parsers of the command line: each turns one flag's text into a value or an argparse error."""

from __future__ import annotations

import argparse


def boolean(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def sizes(text: str) -> list[int]:
    """`1K,2K,512` -> [1024, 2048, 512]."""
    from t2r.eval.settings import parse_sizes

    try:
        return parse_sizes(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def one_size(text: str) -> int:
    found = sizes(text)
    if len(found) != 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give one size, e.g. 16K")
    return found[0]


def count(text: str) -> int:
    """An integer, `2K` = 2048 and `1e3` = 1000 allowed (the setting's bounds say which are sane)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        return one_size(text)
    if not number.is_integer():
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}")
    return int(number)


def floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from err


def names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]
