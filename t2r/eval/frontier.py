"""The window frontier: quality against generation memory per sequence, for the windows of the source and the
model (and any other students) at each measure's context.

A window of W recent tokens plus S sinks of the source is free: the source with a cut KV cache. Swept over W, the
windows draw a curve from a tiny cache to the source's full one (its far end); a converted model is worth keeping
when it lies beyond that curve at its own memory. Memory at context T: `state + per_token * T` for a model (a
fixed state stays flat; hybrids and FoX grow with T), `per_token * min(W + S, T)` for a window.

Measures: perplexity and KL to the source of each late position bucket (from 256 on; at least the last) at the
bucket's end, for every held-out text (the first's measures unlabelled, the others' named `[label]`), MQAR
accuracy per number of pairs at its prompt length, passkey accuracy (mean over depths) per length. The frontier at
the model's memory is the window curve interpolated linearly in log memory; `frontiers` compares every model and
student with it, `summary_lines` words it, `plot` draws frontier.png.
"""

from __future__ import annotations

import math
from pathlib import Path

LATE_FROM = 256
"""Perplexity buckets starting here or later are "late": where a window has dropped context."""
POINT_ROLES = ("model", "student")


def memory(contender: dict, context: int) -> int:
    """Generation-cache bytes of one sequence after `context` tokens (`contender`: an entry of
    `results["contenders"]`)."""
    tokens = min(contender["window"] + contender["sinks"], context) if contender.get("window") else context
    return contender["state_bytes"] + contender["bytes_per_token"] * tokens


def measures(results: dict) -> list[dict]:
    """{"name", "context", "higher_is_better", "values": {contender: value}} of every frontier measure present."""
    found = []
    for text in [results] + results.get("texts", []):  # the first text's sections, then any other text's
        suffix = f" [{text['label']}]" if text is not results else ""
        for key, value in (("perplexity", "ppl"), ("kl", "kl")):
            if key not in text:
                continue
            rows = text[key]["results"]
            spans = [(b["start"], b["end"]) for b in rows[0]["buckets"]]
            late = [s for s in spans if s[0] >= LATE_FROM] or spans[-1:]
            for start, end in late:
                values = {r["name"]: b[value] for r in rows for b in r["buckets"]
                          if (b["start"], b["end"]) == (start, end)}
                found.append({"name": f"{value} {_tokens(start)}-{_tokens(end)}{suffix}", "context": end,
                              "higher_is_better": False, "values": values})
    if "mqar" in results:
        section = results["mqar"]
        for i, (pairs, tokens) in enumerate(zip(section["pairs"], section["tokens"])):
            found.append({"name": f"mqar {pairs} pairs", "context": tokens, "higher_is_better": True,
                          "values": {n: acc[i] for n, acc in section["accuracy"].items()}})
    if "passkey" in results:
        section = results["passkey"]
        for i, length in enumerate(section["lengths"]):
            found.append({"name": f"passkey {_tokens(length)}", "context": length, "higher_is_better": True,
                          "values": {n: sum(acc[i]) / len(acc[i]) for n, acc in section["accuracy"].items()}})
    return found


def curve(measure: dict, contenders: list[dict]) -> list[dict]:
    """The frontier's points ({"name", "memory", "value"}), by memory: every window and, as its far end, the
    softmax model the windows cut. Windows that see the whole context are that model itself and are left out."""
    far = next((c for c in contenders if c.get("windowed")), None)
    if far is None or far["name"] not in measure["values"]:
        return []
    end = memory(far, measure["context"])
    points = [{"name": c["name"], "memory": memory(c, measure["context"]), "value": measure["values"][c["name"]]}
              for c in contenders if c["role"] == "window" and c["name"] in measure["values"]]
    points = [p for p in points if p["memory"] < end]
    if not points:
        return []
    return sorted(points, key=lambda p: p["memory"]) + [{"name": far["name"], "memory": end,
                                                          "value": measure["values"][far["name"]]}]


def frontier_at(points: list[dict], at: float) -> tuple[float, str]:
    """(the curve's value at memory `at`, where on the curve that is), linear in log memory between the two
    points around `at`; the end points beyond the curve's range."""
    first, last = points[0], points[-1]
    if at <= first["memory"]:
        exact = at == first["memory"]
        return first["value"], (f"at {first['name']}" if exact else
                                f"{first['name']}, the smallest window, which takes more memory")
    if at >= last["memory"]:
        return last["value"], f"at {last['name']}" if at == last["memory"] else f"{last['name']}, the far end"
    for lo, hi in zip(points, points[1:]):
        if lo["memory"] <= at <= hi["memory"]:
            share = (math.log(at) - math.log(lo["memory"])) / (math.log(hi["memory"]) - math.log(lo["memory"]))
            return lo["value"] + share * (hi["value"] - lo["value"]), f"between {lo['name']} and {hi['name']}"
    raise AssertionError("unreachable: the points are sorted by memory")


def frontiers(results: dict) -> list[dict]:
    """Per measure: the curve, and every model and student against it ({"name", "role", "memory", "value",
    "frontier", "where", "difference", "better"}); measures without a window curve are left out."""
    contenders = results.get("contenders", [])
    out = []
    for measure in measures(results):
        points = curve(measure, contenders)
        if not points:
            continue
        placed = []
        for c in contenders:
            if c["role"] not in POINT_ROLES or c["name"] not in measure["values"]:
                continue
            at, value = memory(c, measure["context"]), measure["values"][c["name"]]
            frontier, where = frontier_at(points, at)
            difference = value - frontier
            placed.append({"name": c["name"], "role": c["role"], "memory": at, "value": value, "frontier": frontier,
                           "where": where, "difference": difference,
                           "better": difference > 0 if measure["higher_is_better"] else difference < 0})
        out.append({"measure": measure["name"], "context": measure["context"],
                    "higher_is_better": measure["higher_is_better"], "curve": points, "points": placed})
    return out


def verdict(point: dict, higher_is_better: bool) -> str:
    """`below the frontier by 2.31 (better)`: where the point lies on the plot, and what that means."""
    d = point["difference"]
    if d == 0:
        return "on the frontier"
    share = f" ({abs(d) / point['frontier']:.0%})" if not higher_is_better and point["frontier"] else ""
    amount = f"{abs(d):.2f}{share}"
    return f"{'above' if d > 0 else 'below'} the frontier by {amount} ({'better' if point['better'] else 'worse'})"


def summary_lines(results: dict) -> list[str]:
    """One line per measure: the model against the window frontier at its memory."""
    lines = []
    for f in results.get("frontier", []):
        for p in f["points"]:
            if p["role"] == "model":
                lines.append(f"- frontier, {f['measure']} at {_tokens(f['context'])} tokens: {p['name']} "
                             f"{p['value']:.2f} at {format_bytes(p['memory'])}, the windows' "
                             f"{p['frontier']:.2f} there ({p['where']}): {verdict(p, f['higher_is_better'])}")
    return lines


def table(results: dict) -> str:
    lines = ["| measure | context | model | memory | value | frontier there | verdict |",
             "|---|---|---|---|---|---|---|"]
    for f in results.get("frontier", []):
        for p in f["points"]:
            lines.append(f"| {f['measure']} | {_tokens(f['context'])} | {p['name']} | {format_bytes(p['memory'])} | "
                         f"{p['value']:.2f} | {p['frontier']:.2f} | {verdict(p, f['higher_is_better'])} |")
    return "\n".join(lines)


def format_bytes(count: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= size:
            value = count / size
            return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return f"{count:.0f} B"


def _tokens(n: int) -> str:
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


MARKERS = ("D", "s", "^", "v", "P", "X", "h")
STUDENT_COLOURS = ("C0", "C1", "C2", "C4", "C6", "C8", "C9")
"""Not C3 (the model's red) nor grey (the windows)."""


def plot(results: dict, out_dir: Path) -> Path | None:
    """frontier.png: one panel per measure; the window curve (dashed, each point labelled with its W), the far
    end (a star), the model and students (hollow markers drawn last and larger, so nothing hides under them)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import ScalarFormatter

    from .axes import log_axis

    panels = results.get("frontier", [])
    if not panels:
        return None
    columns = min(3, len(panels))
    rows = math.ceil(len(panels) / columns)
    fig = Figure(figsize=(4.6 * columns, 3.6 * rows), layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False).flatten()
    for ax, f in zip(axes, panels):
        windows, far = f["curve"][:-1], f["curve"][-1]
        ax.plot([p["memory"] for p in f["curve"]], [p["value"] for p in f["curve"]], linestyle="--", color="0.45",
                marker="o", markersize=4, zorder=1, label="windows of the source")
        for p in windows:
            ax.annotate(p["name"].split()[-1], (p["memory"], p["value"]), textcoords="offset points", xytext=(3, 4),
                        fontsize=6, color="0.35")
        ax.plot([far["memory"]], [far["value"]], marker="*", markersize=12, color="black", linestyle="none",
                zorder=2, label=far["name"])
        for i, p in enumerate(sorted(f["points"], key=lambda p: p["role"] == "model")):  # the model last, on top
            model = p["role"] == "model"
            ax.plot([p["memory"]], [p["value"]], marker="D" if model else MARKERS[1 + i % (len(MARKERS) - 1)],
                    markersize=9 if model else 7, markerfacecolor="none", markeredgewidth=2,
                    color="C3" if model else STUDENT_COLOURS[i % len(STUDENT_COLOURS)], linestyle="none",
                    zorder=4 if model else 3, label=p["name"])
        log_axis(ax.xaxis, [p["memory"] for p in f["curve"] + f["points"]], format_bytes, base=2)
        if f["higher_is_better"]:
            ax.yaxis.set_major_formatter(ScalarFormatter(useOffset=False))
        else:  # perplexities span orders of magnitude between a fresh model and the windows: log, plain labels
            log_axis(ax.yaxis, [p["value"] for p in f["curve"] + f["points"]])
        ax.tick_params(axis="x", labelsize=7, labelrotation=30)
        ax.set(title=f"{f['measure']} ({_tokens(f['context'])} tokens)", xlabel="generation memory per sequence",
               ylabel="perplexity (lower is better)" if not f["higher_is_better"] else "accuracy (higher is better)")
        if f["higher_is_better"]:
            ax.set_ylim(-0.03, 1.03)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize="x-small")
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    path = out_dir / "frontier.png"
    fig.savefig(path, dpi=120)
    return path
