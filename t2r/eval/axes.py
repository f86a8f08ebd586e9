"""Plot helpers shared by the evaluation's figures: readable log axes, and series that never hide each other."""

from __future__ import annotations

import math


def log_axis(axis, values, formatter=None, base: int = 10) -> None:
    """Log scale on `axis` (ax.xaxis or ax.yaxis) with plain tick labels (`26.5`, or `formatter(value)`), never
    `2.65x10^1`: over less than a factor `base` the ticks are evenly spaced nice numbers, wider ranges get
    1-2-5 steps (base 10) or powers of two (base 2, for bytes)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter, NullLocator

    values = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    axis.axes.set(**{f"{axis.axis_name}scale": "log"})
    if values and max(values) / min(values) < base:
        axis.set_major_locator(MaxNLocator(5))
    else:
        axis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)) if base == 10 else LogLocator(base=base))
    axis.set_major_formatter(FuncFormatter(lambda v, _: formatter(v) if formatter else f"{v:.3g}"))
    axis.set_minor_locator(NullLocator())
    axis.set_minor_formatter(NullFormatter())


def spread(values: list[float], index: int, count: int, width: float = 0.06) -> list[float]:
    """`values` (on a log axis) nudged by a small factor, a different one for each of `count` series, so that
    series with equal values lie side by side instead of one under the other."""
    factor = 2 ** (width * (index - (count - 1) / 2))
    return [v * factor for v in values]
