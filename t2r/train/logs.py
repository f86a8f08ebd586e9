"""What a run reports as it goes: the progress bar, `metrics.jsonl` (one JSON object per optimizer step;
a skipped non-finite step has `"loss": null` and `"skipped": true`), tracker config, and `loss.png`."""

from __future__ import annotations

import json
import math
from pathlib import Path


def flat(recipe) -> dict:
    """The recipe as one level of `section.field` keys with scalar values (tracker hyperparameters)."""
    out = {}
    for section, values in recipe.to_dict().items():
        if isinstance(values, dict):
            out.update({f"{section}.{k}": v if isinstance(v, (int, float, str, bool)) else str(v)
                        for k, v in values.items()})
        else:
            out[section] = values
    return out


def progress(total: int, start: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=start, disable=not enabled, unit="step", dynamic_ncols=True)


def finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def append_jsonl(path: Path, row: dict) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps(row) + "\n")


def read_history(path: Path, up_to_step: int) -> list[dict]:
    """Metrics of earlier steps (a resumed run rewrites the file without the steps it redoes)."""
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["step"] <= up_to_step]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def plot(history: list[dict], path: Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # plots are optional (pip install t2r[eval])
        return
    rows = [r for r in history if r.get("loss") is not None]
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([r["tokens"] / 1e6 for r in rows], [r["loss"] for r in rows])
    ax.set(xlabel="tokens (M)", ylabel="training loss", title=title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
