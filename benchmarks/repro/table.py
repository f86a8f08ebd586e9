"""One table of the repro experiment from the eval results: `python benchmarks/repro/table.py RUNS_DIR`.

RUNS_DIR holds `source/eval/results.json` (benchmarks/repro/eval_source.py) and `<student>/eval/results.json`
(`t2r run --config recipes/repro/<student>.yaml`); printed as Markdown: perplexity by position, recall and local
tasks, with each student's share of the source (recovered %, t2r.eval.recovered)."""

import json
import sys
from pathlib import Path

from t2r.eval import recovered


def load(path: Path) -> dict:
    results = json.loads(path.read_text())
    name = results["names"]["model"]
    row = {"name": path.parent.parent.name, "model": name}
    ppl = next(r for r in results["perplexity"]["results"] if r["name"] == name)
    row["ppl"] = ppl["ppl"]
    row["buckets"] = {f"{b['start']}-{b['end']}": b["ppl"] for b in ppl["buckets"]}
    row["windows"] = {r["name"]: r for r in results["perplexity"]["results"] if r.get("role") == "window"}
    row["mqar"] = results["mqar"]["accuracy"][name]
    row["passkey"] = [sum(a) / len(a) for a in results["passkey"]["accuracy"][name]]
    row["tasks"] = {t: r["value"] for t, r in results.get("tasks", {}).get(name, {}).get("tasks", {}).items()}
    row["meta"] = {k: results["perplexity"][k] for k in ("data", "length", "rows")}
    row["meta"].update(pairs=results["mqar"]["pairs"], lengths=results["passkey"]["lengths"])
    return row


def main(root: Path) -> str:
    source = load(root / "source" / "eval" / "results.json")
    students = [load(p) for p in sorted(root.glob("*/eval/results.json")) if p.parent.parent.name != "source"]
    rows = [source, *students]
    spans, tasks = list(source["buckets"]), list(source["tasks"])
    head = ["model", *[f"ppl {s}" for s in spans], "ppl", "MQAR", "passkey", *tasks, "tasks avg", "tasks recovered"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---|" * (len(head) - 1)]
    for r in rows:
        task_avg = sum(r["tasks"].values()) / max(len(r["tasks"]), 1)
        source_avg = sum(source["tasks"].values()) / max(len(source["tasks"]), 1)
        share = recovered(task_avg, source_avg)
        cells = [r["name"], *[f"{r['buckets'].get(s, float('nan')):.2f}" for s in spans], f"{r['ppl']:.2f}",
                 f"{sum(r['mqar']) / len(r['mqar']):.2f}", f"{sum(r['passkey']) / len(r['passkey']):.2f}",
                 *[f"{r['tasks'].get(t, float('nan')):.3f}" for t in tasks], f"{task_avg:.3f}",
                 "-" if share is None else f"{share:.1f}%"]
        lines.append("| " + " | ".join(cells) + " |")
    for name, w in source["windows"].items():
        lines.append(f"| {name} (training-free) | " + " | ".join(f"{b['ppl']:.2f}" for b in w["buckets"])
                     + f" | {w['ppl']:.2f} |" + " |" * (len(head) - len(spans) - 2))
    m = source["meta"]
    notes = (f"\nPerplexity: {m['rows']} rows of {m['length']} tokens of `{m['data']}`. MQAR: mean accuracy over "
             f"{m['pairs']} pairs; passkey: mean over lengths {m['lengths']} and depths.\n")
    recall = ["", "| model | " + " | ".join(f"MQAR {p}" for p in m["pairs"]) + " | "
              + " | ".join(f"passkey {n}" for n in m["lengths"]) + " |",
              "|---|" + "---|" * (len(m["pairs"]) + len(m["lengths"]))]
    for r in rows:
        recall.append(f"| {r['name']} | " + " | ".join(f"{a:.2f}" for a in r["mqar"] + r["passkey"]) + " |")
    return "\n".join(lines) + notes + "\n".join(recall) + "\n"


if __name__ == "__main__":
    print(main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/repro")))
