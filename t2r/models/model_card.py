"""The model card: `README.md` in a model directory t2r writes (by `t2r convert`, and `final/` of a finetuning run),
in the form the Hugging Face hub displays: YAML front matter (library, base model, tags, training datasets and,
once evaluated, a `model-index` of the metrics), then what the model is.

It says what the directory's own config records (source, converted layers, each target's options, and what each
target's fresh layers compute, from the mixer registry), what the writer passes in (the command that made it, the
training: recipe, stages, steps, tokens, data, held-out loss) and, once `t2r eval` or `t2r run` measured it,
`add_evaluation`: the report's summary lines and window-frontier verdicts, the frontier plot linked, every number
read from that evaluation's results.json. Reads and writes text only.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Callable

CARD = "README.md"
EVALUATION = "## Evaluation"
RESULTS = "results.json"
FRONTIER_PLOT = "frontier.png"
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
"""What t2r's default model `smollm2` is a quantized copy of (the card's base_model)."""
LIBRARY = "transformers"
"""The card's library_name: the weights and config load with transformers' Auto classes once `import t2r` has
registered the converted model types (the card's Use section says so); `t2r` is no library the hub knows."""
TEACHER_INIT = re.compile(r"--init[= ]teacher\b|\binit=['\"]?teacher\b")
"""How a command that made a model says its forget gates started from the source's look-back (not recorded in the
config, whose gate options keep their defaults)."""


def _hub_id(spec: str | None) -> str | None:
    """`spec` when it names a hub repository (`t2r.paths`: owner/name, nothing local there), else None."""
    from t2r.paths import looks_local

    if not spec or spec.startswith("~") or "/" not in spec:
        return None
    try:
        return None if looks_local(spec) else spec
    except (OSError, ValueError):
        return None


def _base_model(source: str | None) -> str | None:
    """The hub id a source names, for the front matter; None for local paths and files."""
    return SMOLLM2_HUB_ID if source == "smollm2" else _hub_id(source)


def _layers(mixers: list[str]) -> str:
    counts = {m: mixers.count(m) for m in dict.fromkeys(mixers)}
    return ", ".join(f"{n} {m}" for m, n in counts.items())


def _options(options: dict) -> str:
    return "; ".join(f"{target}: " + ", ".join(f"{k}={v}" for k, v in sorted(values.items()))
                     for target, values in sorted(options.items())) or "-"


def _card_name(location) -> str:
    where = Path(location)
    return where.parent.name if where.name == "final" and where.parent.name else where.name


def fresh_behaviour(target: str, saved_options: dict, made_by: str = "") -> str:
    """What a freshly converted `target` layer computes, from the mixer registry: its spec's summary and whether
    its options start it as the source attention (`MixerOptions.starts_as_source`: FoX with RoPE, whose forget
    gates start open) or not (every other target, and any target whose gates a teacher init set)."""
    from t2r.layers.registry import MIXERS

    spec = MIXERS.get(target)
    if spec is None:
        return f"{target}: not registered in this t2r, so nothing is claimed of its fresh layers"
    try:
        starts = spec.options_from_config(saved_options or {}).starts_as_source()
    except (TypeError, ValueError):  # options this t2r does not read: no claim either way
        return f"{target} ({spec.summary}): options this t2r does not read, so nothing is claimed of its fresh layers"
    if spec.teacher_init and TEACHER_INIT.search(made_by or ""):
        what = ("its forget gates start at the decay of the source's look-back (`--init teacher`), so it does not "
                "compute what the source does; finetuning (`t2r finetune`) adapts the rest to them")
    elif starts:
        what = f"starts as the source: {starts}"
    else:
        what = "computes something other than the source's softmax attention until finetuned (`t2r finetune`)"
    return f"{target} ({spec.summary}): {what}"


def _front_matter(meta: dict) -> str:
    import yaml

    return "---\n" + yaml.safe_dump(meta, sort_keys=False, allow_unicode=True, width=1000) + "---\n"


def _split(text: str) -> tuple[dict | None, str]:
    """(the card's front matter, None when it has none that reads as a mapping; the text after it)."""
    import yaml

    if not text.startswith("---\n"):
        return None, text
    end = text.find("\n---\n", 3)
    if end < 0:
        return None, text
    try:
        meta = yaml.safe_load(text[4:end + 1])
    except yaml.YAMLError:
        return None, text
    return (meta, text[end + 5:]) if isinstance(meta, dict) else (None, text)


def card_text(config: dict, location: str, made_by: str, training: dict | None = None) -> str:
    """The card of a model with this `config` (config.json as a dict) loaded from `location`, made by the command
    `made_by`; `training`: {"recipe", "stages", "steps", "tokens", "data", "held_out_loss"} of its finetuning
    (None: freshly converted, untrained)."""
    name = _card_name(location)
    source, mixers = config.get("t2r_source"), list(config.get("t2r_mixers") or [])
    targets = sorted(set(mixers) - {"softmax"})
    base = _base_model(source)
    dataset = _hub_id((training or {}).get("data"))
    meta = {"library_name": LIBRARY, **({"base_model": base} if base else {}),
            "tags": ["t2r", "linear-attention", *targets], **({"datasets": [dataset]} if dataset else {})}
    rows = [("source", f"`{source}`" + (f" ({SMOLLM2_HUB_ID} as Q4_1 GGUF weights, dequantized)"
                                        if source == "smollm2" else "")),
            ("layers", f"{config.get('model_type')}, {len(mixers)} layers: {_layers(mixers)}"),
            ("target options", _options(config.get("t2r_options") or {})),
            *([("layers' own options", _options({f"layer {k}": v for k, v in config["t2r_layer_options"].items()}))]
              if config.get("t2r_layer_options") else []),
            ("made by", f"`{made_by}`")]
    if training is None:
        saved = config.get("t2r_options") or {}
        rows.append(("training", "none: freshly converted; "
                     + "; ".join(fresh_behaviour(t, saved.get(t, {}), made_by) for t in targets)
                     if targets else "none: freshly converted, no layer converted"))
    else:
        held = training.get("held_out_loss")
        rows += [("recipe", f"`{training['recipe']}` (resolved in `recipe.yaml` here); stages: "
                            + ", ".join(training.get("stages") or []) or "-"),
                 ("trained", f"{training['steps']:,} steps, {training['tokens']:,} tokens of `{training.get('data')}`"),
                 ("held-out loss", "-" if held is None else f"{held:.3f}")]
    lines = [f"# {name}", "", f"`{source}` with {', '.join(targets) or 'no'} layers in place of softmax "
             "attention, converted by t2r (pretrained Transformers to linear-time RNNs).", "",
             "| | |", "|---|---|", *[f"| {k} | {v} |" for k, v in rows], "",
             "## Use", "", "```python", "import t2r  # registers the converted model types",
             "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
             f'model = AutoModelForCausalLM.from_pretrained("{location}")',
             f'tokenizer = AutoTokenizer.from_pretrained("{location}")', "```", "",
             f"or `t2r generate --model {location} --prompt ...`; `t2r eval --model {location} --out report/` "
             "compares it with its source.", ""]
    return _front_matter(meta) + "\n" + "\n".join(lines)


def write_model_card(directory, made_by: str, training: dict | None = None, location=None) -> Path:
    """Write `directory/README.md` from its config.json (see `card_text`) for a model that will be loaded from
    `location` (default `directory`; a model written aside and renamed into place names its final place)."""
    directory = Path(directory)
    config = json.loads((directory / "config.json").read_text())
    path = directory / CARD
    path.write_text(card_text(config, str(location or directory), made_by, training))
    return path


def _metric(kind: str, value, name: str) -> dict:
    return {"type": kind, "value": value, "name": name}


def _texts(results: dict) -> list[tuple[dict, str]]:
    """(a held-out text's sections, its label): the first at the top level of results.json, then its "texts" (as
    `t2r.eval.report.text_sections` reads them)."""
    first = results.get("perplexity") or results.get("kl")
    found = [(results, first.get("label", "") if first else "")] if first else []
    return found + [(text, text.get("label", "")) for text in results.get("texts", [])]


def model_index(results: dict, name: str) -> list[dict]:
    """The hub's `model-index` of the evaluated model: every value exactly as `results` (results.json) holds it:
    perplexity and KL to the source (overall and per position bucket) per held-out text, MQAR accuracy per number
    of pairs, passkey accuracy per length and needle depth, and each lm-eval task's value."""
    model = results["names"]["model"]
    entries = []
    texts = _texts(results)
    for text, label in texts:
        for key, value, kind in (("perplexity", "ppl", "perplexity"), ("kl", "kl", "kl_divergence")):
            if key not in text:
                continue
            section = text[key]
            row = next((r for r in section["results"] if r["name"] == model), None)
            if row is None:
                continue
            what = "perplexity" if key == "perplexity" else f"KL to {section.get('reference')} (nats per token)"
            metrics = [_metric(kind, row[value], f"{what}, all positions"),
                       *[_metric(kind, b[value], f"{what}, positions {b['start']}-{b['end']}")
                         for b in row["buckets"]]]
            data = section.get("data")
            entries.append({"task": {"type": "text-generation", "name": "Language modeling"},
                            "dataset": {"type": _hub_id(data) or "text", "name": f"{label or data} (`{data}`)"
                                        if label and label != data else str(data)},
                            "metrics": metrics})
    for key, title in (("mqar", "Multi-query associative recall (synthetic)"),
                       ("passkey", "Passkey retrieval (synthetic)")):
        section = results.get(key)
        if not section or model not in section.get("accuracy", {}):
            continue
        acc = section["accuracy"][model]
        if key == "mqar":
            metrics = [_metric("accuracy", a, f"MQAR accuracy, {p} pairs ({t} tokens)")
                       for a, p, t in zip(acc, section["pairs"], section["tokens"])]
        else:
            metrics = [_metric("accuracy", a, f"passkey accuracy, {length} tokens, needle depth {d:g}")
                       for length, row in zip(section["lengths"], acc) for a, d in zip(row, section["depths"])]
        entries.append({"task": {"type": "text-generation", "name": title},
                        "dataset": {"type": key, "name": title}, "metrics": metrics})
    for task, result in ((results.get("tasks") or {}).get(model, {}).get("tasks") or {}).items():
        if result.get("value") is not None:
            entries.append({"task": {"type": "text-generation", "name": "lm-eval"},
                            "dataset": {"type": task, "name": task},
                            "metrics": [_metric(result.get("metric") or "value", result["value"], task)]})
    return [{"name": name, "results": entries}] if entries else []


def _link(target: Path, start: Path) -> str:
    """`target` relative to `start` (the card's directory) when they share a root, else absolute; POSIX form."""
    try:
        return Path(os.path.relpath(target.resolve(), start.resolve())).as_posix()
    except ValueError:  # another drive
        return target.resolve().as_posix()


def evaluation_section(results: dict, results_path: Path, directory: Path, summary: list[str],
                       verdicts: list[str]) -> list[str]:
    """The card's evaluation section: the report's `summary` lines, the window frontier's `verdicts` and its plot
    when one was drawn, links relative to the card's `directory`."""
    out = results_path.parent
    report = out / "report.md"
    names = results["names"]
    against = f"its source `{names['baseline']}`" if names.get("baseline") else "no baseline"
    head = (f"`t2r eval` of `{names['model']}` against {against}: "
            + (f"[report]({_link(report, directory)}), " if report.is_file() else "")
            + f"every number from [results.json]({_link(results_path, directory)}).")
    if results.get("command"):
        head += f" Command: `{results['command']}`."
    lines = [EVALUATION, "", head, ""]
    if results.get("quick"):
        lines += ["**Quick look** (cut to: " + "; ".join(results["quick"]) + "): not a full evaluation.", ""]
    if results.get("unfinished"):
        lines += [f"**Unfinished**: {', '.join(results['unfinished'])} did not run.", ""]
    summary = [line for line in summary if line not in verdicts]
    if summary:
        lines += ["### Against the source", "", *summary, ""]
    if verdicts or results.get("frontier"):
        lines += ["### Window frontier", "",
                  "Against sliding windows of the source at the same generation memory per sequence:", "", *verdicts,
                  ""]
        plot = out / FRONTIER_PLOT
        if FRONTIER_PLOT in (results.get("plots") or []) and plot.is_file():
            lines += [f"![window frontier]({_link(plot, directory)})", ""]
    if not summary and not verdicts:
        lines += ["No comparison with a source (no baseline): the measured values are in the front matter's "
                  "model-index.", ""]
    return lines


def add_evaluation(directory, results, summary: Callable[[dict], list[str]] | None = None,
                   verdicts: Callable[[dict], list[str]] | None = None) -> Path | None:
    """Put (or replace) the card's evaluation: the front matter's `model-index` and the `## Evaluation` section,
    both read from `results` (an evaluation's results.json, or the directory holding it, as `t2r eval --out` and
    `t2r run` write them). `summary` and `verdicts` word what that file holds (`t2r.eval.report.summary_lines` and
    `t2r.eval.frontier.summary_lines`, which the command line passes: the evaluation is a layer above the models).
    None when the directory has no t2r model card (a card without the `t2r` tag is not t2r's and is left alone)."""
    directory = Path(directory)
    path = directory / CARD
    if not path.is_file():
        return None
    meta, body = _split(path.read_text())
    if meta is None or "t2r" not in (meta.get("tags") or []):
        return None
    results_path = Path(results)
    if results_path.is_dir():
        results_path = results_path / RESULTS
    data = json.loads(results_path.read_text())
    body = body.split(f"\n{EVALUATION}\n")[0].rstrip("\n")
    meta.pop("model-index", None)
    index = model_index(data, _card_name(directory.resolve()))
    if index:
        meta["model-index"] = index
    section = evaluation_section(data, results_path, directory, summary(data) if summary else [],
                                 verdicts(data) if verdicts else [])
    path.write_text(_front_matter(meta) + body + "\n\n" + "\n".join(section).rstrip("\n") + "\n")
    return path
