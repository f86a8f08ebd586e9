"""Numbers in words a user reads: `counted(1, "row")` is "1 row", `counted(4, "micro-batch")` "4 micro-batches"."""

from __future__ import annotations


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`count` and `noun`, plural unless `count` is 1 (`plural`, or the noun with -es after s/x/ch/sh, else -s)."""
    if count == 1:
        return f"{count} {noun}"
    return f"{count:,} {plural or (noun + 'es' if noun.endswith(('s', 'x', 'ch', 'sh')) else noun + 's')}"


def token_unit(largest: float) -> tuple[float, str]:
    """(divisor, unit) that writes token counts up to `largest` as plain numbers: (1, "") below 10K, (1e3, "K")
    below 10M, (1e6, "M") below 10B, else (1e9, "B")."""
    for divisor, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if largest >= 10 * divisor:
            return divisor, unit
    return 1.0, ""
