"""The seeds' table (issue 38) from students evaluated by `benchmarks/repro/student.sh eval`:

    python benchmarks/repro/seeds_table.py RUN_DIR...      # e.g. runs/repro/smollm2-{gsa,gla,retnet,gdn}

Each RUN_DIR holds `eval-2k/results.json` and `eval-8k/results.json` (the source and its windows are scored in
the same runs) and `metrics.jsonl` (training speed). Printed as Markdown: one row per student and one for the
source, each cell read from results.json; then the memory-matched window of each student (its mem window
contender), in a table of its own."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def _bucket(results: dict, name: str, span: str, key: str) -> float:
    row = next(r for r in results["results"] if r["name"] == name)
    return next(b[key] for b in row["buckets"] if f"{b['start']}-{b['end']}" == span)


def _texts(results: dict) -> list[tuple[str, dict, dict]]:
    """(label, perplexity, kl) of every text an eval scored, the first text first."""
    first = (results["perplexity"]["label"], results["perplexity"], results.get("kl"))
    return [first, *[(t["label"], t["perplexity"], t.get("kl")) for t in results.get("texts", [])]]


def _mean(values) -> float:
    values = [v for row in values for v in (row if isinstance(row, list) else [row])]
    return sum(values) / len(values)


def _tasks(results: dict, name: str) -> float | None:
    tasks = results.get("tasks", {}).get(name, {}).get("tasks", {})
    return _mean([t["value"] for t in tasks.values()]) if tasks else None


def _speed(run: Path) -> float | None:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    speeds = [r["tokens_per_s"] for r in rows if r.get("stage") == "distill" and "tokens_per_s" in r]
    return statistics.median(speeds) if speeds else None


def rows(run: Path) -> list[dict]:
    """The student's row and its source's, from one run's two evaluations."""
    short, long = (json.loads((run / f"eval-{n}/results.json").read_text()) for n in ("2k", "8k"))
    out = []
    for role in ("model", "baseline"):
        name = short["names"][role]
        row = {"name": run.name if role == "model" else name, "mib": short["models"][role]["state_bytes"] / 2**20}
        for label, ppl, kl in _texts(short):
            row[f"ppl 1K-2K {label}"] = _bucket(ppl, name, "1024-2048", "ppl")
            row[f"kl 1K-2K {label}"] = _bucket(kl, name, "1024-2048", "kl") if kl else None
        for label, ppl, kl in _texts(long):
            row[f"ppl 4K-8K {label}"] = _bucket(ppl, name, "4096-8192", "ppl")
        row["mqar"] = _mean(short["mqar"]["accuracy"][name])
        row["passkey 2K"] = _mean(short["passkey"]["accuracy"][name])
        row["passkey 8K"] = _mean(long["passkey"]["accuracy"][name])
        row["tasks"] = _tasks(short, name)
        row["distill tok/s"] = _speed(run) if role == "model" else None
        out.append(row)
    return out


def memory_window(run: Path) -> dict | None:
    """The training-free window of the student's own memory (the frontier point it must beat), 2K evaluation;
    None for a student whose memory grows like the source's (FoX keeps every key and value: no window matches)."""
    short = json.loads((run / "eval-2k/results.json").read_text())
    name = next((r["name"] for r in short["perplexity"]["results"] if r["name"].startswith("mem window")), None)
    if name is None:
        return None
    row = {"name": f"{run.name}: {name}"}
    for label, ppl, kl in _texts(short):
        row[f"ppl 1K-2K {label}"] = _bucket(ppl, name, "1024-2048", "ppl")
        row[f"kl 1K-2K {label}"] = _bucket(kl, name, "1024-2048", "kl") if kl else None
    row["mqar"] = _mean(short["mqar"]["accuracy"][name])
    return row


def markdown(table: list[dict]) -> str:
    columns = [c for c in table[0] if c != "name"]
    lines = ["| model | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for row in table:
        cells = ["-" if row[c] is None else f"{row[c]:,.0f}" if c.endswith("tok/s") else f"{row[c]:.2f}"
                 if not c.startswith("kl") else f"{row[c]:.3f}" for c in columns]
        lines.append(f"| {row['name']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(runs: list[Path]) -> str:
    table = []
    for run in runs:
        student, source = rows(run)
        table.append(student)
    table.append(source)  # the same source scores in every run (read from the evaluation cache)
    windows = [row for row in map(memory_window, runs) if row is not None]
    return markdown(table) + ("\n\n" + markdown(windows) if windows else "")


if __name__ == "__main__":
    print(main([Path(p) for p in sys.argv[1:]]))
