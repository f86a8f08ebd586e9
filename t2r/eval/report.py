"""The evaluation report: `report.md` (tables a user can read), `results.json` (every number) and PNG plots.

Everything here formats numbers computed elsewhere (`perplexity`, `recall`, `harness`, `bench`); the one
number made here is the recovered share, `recovered()`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from t2r.words import counted

from . import frontier
from .axes import log_axis, nudge, spread
from .bench import BenchRow, format_table
from .bench import plot as plot_bench


def recovered(model: float, baseline: float, higher_is_better: bool = True) -> float | None:
    """How much of the baseline's score the model keeps, in %: model / baseline for scores where higher is
    better (accuracy), baseline / model where lower is better (perplexity, loss). None when undefined."""
    if model is None or baseline is None or any(map(math.isnan, (model, baseline))):
        return None
    numerator, denominator = (model, baseline) if higher_is_better else (baseline, model)
    return 100.0 * numerator / denominator if denominator > 0 else None


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


def _num(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _span(lo: int, hi: int) -> str:
    def k(n):
        return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)
    return f"{k(lo)}-{k(hi)}"


def bucket_table(section: dict, value: str = "ppl", digits: int = 2) -> str:
    """One row per contender of `section` (a perplexity or KL section): `value` per position bucket, then overall."""
    rows = section["results"]
    spans = [(b["start"], b["end"]) for b in rows[0]["buckets"]]
    lines = ["| model | " + " | ".join(_span(*s) for s in spans) + " | all |",
             "|---|" + "---|" * (len(spans) + 1)]
    for row in rows:
        by_span = {(b["start"], b["end"]): b[value] for b in row["buckets"]}
        lines.append(f"| {row['name']} | " + " | ".join(_num(by_span.get(s), digits) for s in spans)
                     + f" | {_num(row[value], digits)} |")
    return "\n".join(lines)


def perplexity_table(section: dict) -> str:
    return bucket_table(section, "ppl", 2)


def kl_table(section: dict) -> str:
    """Mean KL to the reference (nats per token) per position bucket, one row per contender."""
    return bucket_table(section, "kl", 3)


def text_sections(results: dict) -> list[tuple[dict, str]]:
    """(a text's sections, its label) for every held-out text: the first at the top level of `results`, then
    `results["texts"]`."""
    first = results.get("perplexity") or results.get("kl")
    found = [(results, first.get("label", "") if first else "")] if first else []
    return found + [(text, text["label"]) for text in results.get("texts", [])]


def mqar_table(section: dict) -> str:
    names = list(section["accuracy"])
    lines = ["| pairs (tokens) | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for i, (pairs, tokens) in enumerate(zip(section["pairs"], section["tokens"])):
        lines.append(f"| {pairs} ({tokens}) | " + " | ".join(_num(section["accuracy"][n][i], 2) for n in names) + " |")
    return "\n".join(lines)


def passkey_table(section: dict) -> str:
    """Accuracy per length, averaged over depths (the per-depth grid is in results.json and the heat map)."""
    names = list(section["accuracy"])
    lines = ["| length | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for i, length in enumerate(section["lengths"]):
        cells = [sum(section["accuracy"][n][i]) / len(section["depths"]) for n in names]
        lines.append(f"| {length} | " + " | ".join(_num(c, 2) for c in cells) + " |")
    return "\n".join(lines)


def tasks_table(tasks: dict, model: str, baseline: str | None) -> str:
    head = ["task", "metric", *( [baseline] if baseline else []), model, *(["recovered"] if baseline else [])]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---|" * (len(head) - 1)]
    for task, result in tasks[model]["tasks"].items():
        cells = [task, result["metric"] or "-"]
        if baseline:
            base = tasks[baseline]["tasks"].get(task, {}).get("value")
            cells += [_num(base), _num(result["value"]), _pct(recovered(result["value"], base))]
        else:
            cells.append(_num(result["value"]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_lines(results: dict) -> list[str]:
    """One line per measurement: the converted model against its baseline."""
    model, baseline = results["names"]["model"], results["names"].get("baseline")
    if not baseline:
        return []
    lines = []
    texts = text_sections(results)
    for text, label in texts:
        on = f" on {label}" if len(texts) > 1 else ""
        if "perplexity" in text:
            by_name = {r["name"]: r for r in text["perplexity"]["results"]}
            m, b = by_name[model], by_name[baseline]
            late_m, late_b = m["buckets"][-1], b["buckets"][-1]
            lines.append(f"- perplexity{on}: {m['ppl']:.2f} vs {b['ppl']:.2f} "
                         f"({_pct(recovered(m['ppl'], b['ppl'], False))} recovered); at positions "
                         f"{_span(late_m['start'], late_m['end'])}: {late_m['ppl']:.2f} vs {late_b['ppl']:.2f}")
            windows = [r for r in text["perplexity"]["results"] if r.get("role") == "window"]
            beaten = [w["name"] for w in windows if late_m["ppl"] < w["buckets"][-1]["ppl"]]
            if windows:
                lines.append(f"- late positions{on}: the model beats {len(beaten)} of {len(windows)} window baselines"
                             + (f" ({', '.join(beaten)})" if beaten else
                                " (a sliding window of that memory would do as well: the state adds nothing yet)"))
        if "kl" in text:
            by_name = {r["name"]: r for r in text["kl"]["results"]}
            m = by_name[model]
            late = m["buckets"][-1]
            lines.append(f"- KL to {text['kl']['reference']}{on}: {m['kl']:.3f} nats per token; at positions "
                         f"{_span(late['start'], late['end'])}: {late['kl']:.3f} (the source itself: 0)")
    lines += frontier.summary_lines(results)
    for key in ("mqar", "passkey"):
        if key in results:
            acc = results[key]["accuracy"]
            mean = {n: _mean(v) for n, v in acc.items()}
            lines.append(f"- {key}: mean accuracy {mean[model]:.2f} vs {mean[baseline]:.2f}")
    if "tasks" in results and results["tasks"].get(model, {}).get("tasks"):
        shares = [recovered(r["value"], results["tasks"][baseline]["tasks"][t]["value"])
                  for t, r in results["tasks"][model]["tasks"].items()]
        shares = [s for s in shares if s is not None]
        if shares:
            lines.append(f"- lm-eval tasks: {sum(shares) / len(shares):.1f}% of the baseline on average "
                         f"over {len(shares)} tasks")
    return lines


def _mean(values) -> float:
    flat = [x for v in values for x in (v if isinstance(v, list) else [v])]
    return sum(flat) / max(len(flat), 1)


def markdown(results: dict) -> str:
    names = results["names"]
    parts = [f"# t2r eval: {names['model']}" + (f" vs {names['baseline']}" if names.get("baseline") else ""), ""]
    for role, info in results["models"].items():
        parts.append(f"- {role}: `{info['spec']}` ({info['model_type']}, {info['parameters']:,} parameters; "
                     f"generation cache {info['state_bytes'] / 2**20:.2f} MiB fixed + "
                     f"{info['cache_bytes_per_token'] / 1024:.1f} KiB per token)")
    env = results["environment"]
    parts.append(f"- device {env['device']}, dtype {results['settings']['dtype']}, seed {results['settings']['seed']}; "
                 f"torch {env['torch']}, transformers {env['transformers']}, t2r {env['t2r']}"
                 + (f", lm-eval {env['lm_eval']}" if env.get("lm_eval") else ""))
    parts.append(f"- command: `{results['command']}`")
    if results.get("quick"):
        parts.append(f"- **quick look** (limit {results['settings']['limit']}), cut to: "
                     + "; ".join(results["quick"]) + ". Without --limit every suite runs in full.")
    if results.get("cache"):
        c = results["cache"]
        parts.append(f"- baseline scores: {c['read']} read from `{c['dir']}` (same weights, inputs and settings), "
                     f"{c['scored']} scored and stored there")
    if results.get("unfinished"):
        parts.append(f"- **unfinished**: {', '.join(results['unfinished'])} still to run; this report is rewritten "
                     "after each measurement")
    parts.append("")
    summary = summary_lines(results)
    if summary:
        parts += ["## Summary", *summary, ""]
    texts = text_sections(results)
    for text, label in texts:
        on = f": {label}" if len(texts) > 1 else ""
        if "perplexity" in text:
            p = text["perplexity"]
            parts += [f"## Perplexity by position{on}", "",
                      f"{p['rows']} rows of {p['length']} tokens of `{p['data']}`"
                      + (" (documents packed end to end)" if p["pack"] else " (each a document's first tokens)")
                      + "; token perplexity per position bucket. Window rows: the baseline restricted to its last "
                      "W tokens plus S sink tokens (training-free); `mem` is the window whose KV cache takes the "
                      "model's state bytes.", "", perplexity_table(p), ""]
        if "kl" in text:
            k = text["kl"]
            parts += [f"## KL to the source by position{on}", "",
                      f"KL({k['reference']} || model) in nats per predicted token, on the same {k['rows']} rows of "
                      f"`{k['data']}`; 0 is the source itself. A next-token loss cannot flatter it: a student "
                      "adapted to its training text may beat the source's perplexity there, never its KL.", "",
                      kl_table(k), ""]
    if results.get("frontier"):
        parts += ["## Window frontier", "",
                  "Each model and student against the windows of the source at its own generation memory per "
                  "sequence (the window curve interpolated in log memory; the source is its far end); "
                  "frontier.png draws them.", "", frontier.table(results), ""]
    if "mqar" in results:
        parts += ["## Multi-query associative recall", "",
                  f"Accuracy (exact match of the value, {counted(results['mqar']['count'], 'prompt')} per row).", "",
                  mqar_table(results["mqar"]), ""]
    if "passkey" in results:
        parts += ["## Passkey retrieval", "",
                  f"Accuracy over needle depths {results['passkey']['depths']} "
                  f"({counted(results['passkey']['count'], 'prompt')} per cell).", "",
                  passkey_table(results["passkey"]), ""]
    if results.get("tasks"):
        parts += ["## lm-eval tasks", "", tasks_table(results["tasks"], names["model"], names.get("baseline")), ""]
    if results.get("bench"):
        parts += ["## Speed and memory", "", format_table([BenchRow(**r) for r in results["bench"]]), ""]
    if results.get("plots"):
        parts += ["## Plots", "", *[f"![{Path(p).stem}]({Path(p).name})" for p in results["plots"]], ""]
    timings = results.get("seconds", {})
    if timings:
        parts.append("Time: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()))
    return "\n".join(parts) + "\n"


ROLE_ORDER = {"window": 0, "baseline": 1, "student": 2, "model": 3}


def drawing_order(rows: list[dict], roles: dict) -> list[dict]:
    """Windows first, then the baseline, students, and the model last (on top)."""
    return sorted(rows, key=lambda r: ROLE_ORDER.get(roles.get(r["name"], r.get("role", "model")), 3))




def series_style(role: str, index: int, count: int) -> dict:
    """Line style by role: windows thin, dashed, from dark to light as W grows, the baseline black, students
    dash-dotted, the model red and thick, each with its own marker, drawn in that order (`zorder`) so the model is
    never hidden."""
    from matplotlib import colormaps

    styles = {"window": dict(linestyle="--", linewidth=1, marker="o", markersize=4,
                             color=colormaps["viridis"](0.85 * index / max(count - 1, 1))),
              "baseline": dict(linestyle="-", linewidth=2, marker="s", markersize=5, color="black"),
              "student": dict(linestyle="-.", linewidth=1.5, marker="^", markersize=6,
                              color=frontier.STUDENT_COLOURS[index % len(frontier.STUDENT_COLOURS)]),
              "model": dict(linestyle="-", linewidth=2.2, marker="D", markersize=6, color="C3",
                            markerfacecolor="none", markeredgewidth=1.5)}
    return {**styles.get(role, styles["model"]), "zorder": 1 + ROLE_ORDER.get(role, 3)}


def plots(results: dict, out_dir: Path) -> list[Path]:
    """PNG plots of every section present; empty (with a printed note) when matplotlib is missing."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        print("plots skipped: matplotlib is not installed (pip install matplotlib, or pip install -e .[eval])")
        return []
    paths = []
    roles = {c["name"]: c["role"] for c in results.get("contenders", [])}
    if "perplexity" in results:
        fig = Figure(figsize=(7, 4), layout="constrained")
        ax = fig.subplots()
        rows = drawing_order(results["perplexity"]["results"], roles)
        for i, row in enumerate(rows):
            mids = [math.sqrt(max(b["start"], 1) * b["end"]) for b in row["buckets"]]
            ax.plot(spread(mids, i, len(rows)), [b["ppl"] for b in row["buckets"]], label=row["name"],
                    **series_style(roles.get(row["name"], row.get("role", "model")), i, len(rows)))
        spans = {math.sqrt(max(b["start"], 1) * b["end"]): _span(b["start"], b["end"]) for b in rows[0]["buckets"]}
        log_axis(ax.xaxis, list(spans), lambda v: spans[min(spans, key=lambda m: abs(m - v))], ticks=list(spans))
        log_axis(ax.yaxis, [b["ppl"] for row in rows for b in row["buckets"]])
        ax.set(xlabel="position bucket (tokens)", ylabel="perplexity", title="Perplexity by position")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize="small")
        paths.append(out_dir / "perplexity_by_position.png")
        fig.savefig(paths[-1], dpi=120)
    if "mqar" in results:
        fig = Figure(figsize=(6, 4), layout="constrained")
        ax = fig.subplots()
        rows = drawing_order([{"name": n, "acc": a} for n, a in results["mqar"]["accuracy"].items()], roles)
        for i, row in enumerate(rows):
            ax.plot(spread(results["mqar"]["pairs"], i, len(rows)), nudge(row["acc"], i, len(rows)), label=row["name"],
                    **series_style(roles.get(row["name"], "model"), i, len(rows)))
        log_axis(ax.xaxis, results["mqar"]["pairs"], lambda v: f"{v:.0f}", ticks=results["mqar"]["pairs"])
        ax.set(xlabel="key-value pairs", ylabel="accuracy (series nudged apart by <= 0.04)", ylim=(-0.06, 1.06),
               title="MQAR")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
        paths.append(out_dir / "mqar.png")
        fig.savefig(paths[-1], dpi=120)
    if "passkey" in results:
        section = results["passkey"]
        names = list(section["accuracy"])
        fig = Figure(figsize=(3.2 * len(names), 3.2), layout="constrained")
        for ax, name in zip(fig.subplots(1, len(names), squeeze=False)[0], names):
            image = ax.imshow(section["accuracy"][name], vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
            ax.set(title=name, xlabel="needle depth", ylabel="length",
                   xticks=range(len(section["depths"])), yticks=range(len(section["lengths"])))
            ax.set_xticklabels([f"{d:g}" for d in section["depths"]])
            ax.set_yticklabels(section["lengths"])
        fig.colorbar(image, ax=fig.axes, shrink=0.8, label="accuracy")
        paths.append(out_dir / "passkey.png")
        fig.savefig(paths[-1], dpi=120)
    if results.get("frontier"):
        paths.append(frontier.plot(results, out_dir))
    if results.get("bench"):
        paths += plot_bench([BenchRow(**r) for r in results["bench"]], out_dir)
    return paths


def write(results: dict, out_dir: str | Path, with_plots: bool = True) -> Path:
    """Write plots (unless `with_plots` is False: a report in progress), results.json and report.md into
    `out_dir`; returns the report's path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results["plots"] = [p.name for p in plots(results, out_dir)] if with_plots else []
    (out_dir / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    report = out_dir / "report.md"
    report.write_text(markdown(results))
    return report


def add_card_evaluation(model, results: Path) -> Path | None:
    """Put the evaluation in `results` (results.json) on the model card of `model` when it is a local directory
    with a t2r card (`t2r.models.model_card.add_evaluation`: the summary lines, the frontier verdicts, the
    metrics); a card that cannot be written is a note, the report stands."""
    from t2r.models.model_card import add_evaluation

    directory = Path(model).expanduser()
    if not directory.is_dir():
        return None
    try:
        return add_evaluation(directory, results, summary_lines, frontier.summary_lines)
    except OSError as err:
        print(f"note: the model card in {directory} was not updated: {err}")
        return None
