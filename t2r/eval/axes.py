"""Plot helpers shared by the evaluation's figures: readable log axes, and series that never hide each other."""

from __future__ import annotations

import math

STYLES = (dict(color="C3", marker="D", linestyle="-", markerfacecolor="none", markeredgewidth=1.5),
          dict(color="black", marker="s", linestyle="--"),
          dict(color="C0", marker="o", linestyle=":"),
          dict(color="C2", marker="^", linestyle="-."),
          dict(color="C1", marker="v", linestyle=(0, (5, 1))),
          dict(color="C4", marker="P", linestyle=(0, (3, 1, 1, 1, 1, 1))))
"""Colour, marker and dashes of the i-th series of a plot without roles (bench plots): the first (the model)
red, hollow diamonds; the second (its source) black squares, dashed; then others, each unlike the rest."""


def style(index: int) -> dict:
    return {**STYLES[index % len(STYLES)], "markersize": 6, "linewidth": 1.8, "zorder": 10 - index % len(STYLES)}


def tokens_text(value: float) -> str:
    """`512`, `1K`, `1.5K`, `32K`, `1M`: a token count as tick labels write it."""
    for unit, size in (("M", 2**20), ("K", 2**10)):
        if value >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value:.0f}"


def plain(value: float) -> str:
    """`2,000`, `26.5`, `0.004`: a tick label without exponents."""
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 0.01 or value == 0:
        return f"{value:.3g}"
    return f"{value:.6f}".rstrip("0")


def log_axis(axis, values, formatter=None, base: int = 10, ticks=None) -> None:
    """Log scale on `axis` (ax.xaxis or ax.yaxis) with plain tick labels (`26.5`, or `formatter(value)`), never
    `2.65x10^1` or `2^10`: `ticks` (e.g. the contexts measured) where given; else over less than a factor `base`
    evenly spaced nice numbers, wider ranges 1-2-5 steps (base 10) or powers of two (base 2, for bytes)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, MaxNLocator, NullFormatter, NullLocator

    values = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    axis.axes.set(**{f"{axis.axis_name}scale": "log"})
    if ticks is not None:
        axis.set_major_locator(FixedLocator(sorted(set(ticks))))
    elif values and max(values) / min(values) < base:
        axis.set_major_locator(MaxNLocator(5))
    else:
        axis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)) if base == 10 else LogLocator(base=base))
    axis.set_major_formatter(FuncFormatter(lambda v, _: (formatter or plain)(v)))
    axis.set_minor_locator(NullLocator())
    axis.set_minor_formatter(NullFormatter())


def spread(values: list[float], index: int, count: int, width: float = 0.06) -> list[float]:
    """`values` (on a log axis) nudged by a small factor, a different one for each of `count` series, so that
    series with equal values lie side by side instead of one under the other."""
    factor = 2 ** (width * (index - (count - 1) / 2))
    return [v * factor for v in values]


def nudge(values: list[float], index: int, count: int, step: float = 0.008) -> list[float]:
    """`values` on a linear axis (accuracies in [0, 1]) shifted by `step` times the series' place among `count`,
    so equal series (every model at 0) draw as parallel lines, not one; at most `step * count / 2` off."""
    return [v + step * (index - (count - 1) / 2) for v in values]


def legend(ax, **kwargs) -> None:
    """A legend when the axes hold labelled series (none, silently, when they do not)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kwargs)
