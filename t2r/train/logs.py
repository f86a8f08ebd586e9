"""What a run reports as it goes: the progress bar (on a terminal; elsewhere one plain line per logging
step), `metrics.jsonl` (one JSON object per optimizer step; a skipped non-finite step has `"loss": null` and
`"skipped": true`; last, `{"step", "tokens", "held_out_loss", "held_out_ppl"}` when the recipe holds
documents out), tracker config, and `loss.png`."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

from t2r.words import token_unit


def flat(recipe) -> dict:
    """The recipe as one level of `section.field` keys with scalar values (tracker hyperparameters)."""
    out = {}
    for section, values in recipe.to_dict().items():
        if isinstance(values, dict):
            out.update({f"{section}.{k}": v if isinstance(v, (int, float, str, bool)) else str(v)
                        for k, v in values.items()})
        else:
            out[section] = values if isinstance(values, (int, float, str, bool)) else str(values)
    return out


class Progress:
    """Training progress: a tqdm bar when `stream` (stderr) is a terminal; otherwise (a log file, `nohup`),
    where a bar's carriage returns pile up into one huge line, one plain line on stdout every `every` steps
    and at the last step."""

    def __init__(self, total: int, start: int, enabled: bool, every: int = 1, stream=None, label: str = ""):
        self.total, self.every, self.enabled = total, every, enabled
        self.prefix = f"{label} " if label else ""  # a stage's name: its steps count from 1 within it
        self.started, self.start = time.perf_counter(), start
        stream = sys.stderr if stream is None else stream
        self.bar = None
        if enabled and _is_terminal(stream):
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=start, unit="step", dynamic_ncols=True, file=stream,
                            desc=label or None)

    def step(self, metrics: dict) -> None:
        loss = "skipped" if metrics.get("skipped") else f"{metrics['loss']:.3f}"
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=loss, lr=f"{metrics['lr']:.2e}", tok_s=f"{metrics['tokens_per_s']:,.0f}")
            return
        step = metrics["step"]
        if not self.enabled or (step % self.every and step != self.total):
            return
        elapsed = time.perf_counter() - self.started
        left = elapsed / (step - self.start) * (self.total - step) if step > self.start else 0.0
        print(f"{self.prefix}step {step}/{self.total}  loss {loss}  lr {metrics['lr']:.2e}  "
              f"grad_norm {_number(metrics.get('grad_norm'))}  {metrics['tokens_per_s']:,.0f} tok/s  "
              f"{metrics['tokens']:,} tokens{_peak(metrics)}  elapsed {_duration(elapsed)}  left {_duration(left)}",
              flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def progress(total: int, start: int, enabled: bool, every: int = 1) -> Progress:
    return Progress(total, start, enabled, every)


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


def _peak(metrics: dict) -> str:
    peak = metrics.get("gpu_peak_gib")
    return f"  peak {peak:.1f} GiB" if peak is not None else ""


def _number(value) -> str:
    return "nan" if value is None else f"{value:.3g}"


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"


def finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def append_jsonl(path: Path, row: dict) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps(row) + "\n")


def read_history(path: Path, up_to_step: int, log=print) -> list[dict]:
    """Metrics of earlier steps (a resumed run rewrites the file without the steps it redoes). A cut-off last
    line (the run was killed while writing it) is dropped, and said; any other line that is not a record is a
    `RunDirError` naming it."""
    if not path.is_file():
        return []
    lines = path.read_text().splitlines()
    rows = []
    for number, line in enumerate(lines, 1):
        row = _record(line)
        if row is None and line.strip() and number == len(lines):
            log(f"{path}: line {number} was cut off (the run stopped while writing it); dropped it")
        elif row is None and line.strip():
            from .errors import RunDirError

            raise RunDirError(f"{path}: line {number} is not a metrics record ({line[:40]!r}): delete or repair "
                              "that line, then --resume again")
        elif row is not None:
            rows.append(row)
    rows = [r for r in rows if r["step"] <= up_to_step]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def _record(line: str) -> dict | None:
    """The metrics record a line holds, or None."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) and isinstance(row.get("step"), int) else None


def held_out_row(step: int, tokens: int, loss: float) -> dict:
    """The `metrics.jsonl` record of the held-out loss, measured once after the last step."""
    return {"step": step, "tokens": tokens, "held_out_loss": finite_or_none(loss),
            "held_out_ppl": finite_or_none(math.exp(min(loss, 50))) if math.isfinite(loss) else None}


MATPLOTLIB_MISSING = ("logging.plot: matplotlib is not installed, so {path} was not drawn (the losses are in "
                      "metrics.jsonl); pip install matplotlib (or t2r[train]) to get it, or set logging.plot=false")


def plot(history: list[dict], path: Path, title: str) -> str | None:
    """Draw the training loss against tokens into `path` (tokens in K, M or B as their count asks, ticks as plain
    numbers), and the held-out loss measured after the last step as a point; None, or why it was not drawn
    (matplotlib missing)."""
    try:
        import matplotlib  # noqa: F401 (first: a missing package is said, not raised)
        from matplotlib.figure import Figure
    except ImportError:
        return MATPLOTLIB_MISSING.format(path=path)
    rows = [r for r in history if r.get("loss") is not None]
    if not rows:
        return None
    divisor, unit = token_unit(max(r["tokens"] for r in rows))
    fig = Figure(figsize=(6, 3.5), layout="constrained")
    ax = fig.subplots()
    ax.plot([r["tokens"] / divisor for r in rows], [r["loss"] for r in rows], marker="o" if len(rows) <= 50 else None,
            markersize=3, label="training loss")
    held = [r for r in history if r.get("held_out_loss") is not None]
    if held:
        ax.plot([held[-1]["tokens"] / divisor], [held[-1]["held_out_loss"]], marker="*", markersize=12,
                linestyle="none", color="black", label=f"held-out loss {held[-1]['held_out_loss']:.2f}")
    ax.ticklabel_format(axis="both", style="plain", useOffset=False)
    ax.set(xlabel=f"tokens{f' ({unit})' if unit else ''}", ylabel="loss", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=120)
    return None
