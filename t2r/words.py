"""Numbers in words a user reads: `counted(1, "row")` is "1 row", `counted(4, "micro-batch")` "4 micro-batches"."""

from __future__ import annotations


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`count` and `noun`, plural unless `count` is 1 (`plural`, or the noun with -es after s/x/ch/sh, else -s)."""
    if count == 1:
        return f"{count} {noun}"
    return f"{count:,} {plural or (noun + 'es' if noun.endswith(('s', 'x', 'ch', 'sh')) else noun + 's')}"
