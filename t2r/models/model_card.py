"""The model card: `README.md` in a model directory t2r writes (by `t2r convert`, and `final/` of a finetuning run),
in the Hugging Face convention (YAML front matter: library, base model, tags; then what the model is).

It says what the directory's own config records (source, converted layers, each target's options) and what the
writer passes in: the command that made it, the training (recipe, stages, steps, tokens, data, held-out loss) and,
once measured, an evaluation summary (`add_evaluation`). Reads and writes text only.
"""

from __future__ import annotations

import json
from pathlib import Path

CARD = "README.md"
EVALUATION = "## Evaluation"
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
"""What t2r's default model `smollm2` is a quantized copy of (the card's base_model)."""


def _base_model(source: str | None) -> str | None:
    """The hub id a source names, for the front matter; None for local paths and files."""
    if source == "smollm2":
        return SMOLLM2_HUB_ID
    if source and source.count("/") == 1 and not source.startswith((".", "/", "~")) and not Path(source).exists():
        return source
    return None


def _layers(mixers: list[str]) -> str:
    counts = {m: mixers.count(m) for m in dict.fromkeys(mixers)}
    return ", ".join(f"{n} {m}" for m, n in counts.items())


def _options(options: dict) -> str:
    return "; ".join(f"{target}: " + ", ".join(f"{k}={v}" for k, v in sorted(values.items()))
                     for target, values in sorted(options.items())) or "-"


def card_text(config: dict, location: str, made_by: str, training: dict | None = None) -> str:
    """The card of a model with this `config` (config.json as a dict) loaded from `location`, made by the command
    `made_by`; `training`: {"recipe", "stages", "steps", "tokens", "data", "held_out_loss"} of its finetuning
    (None: freshly converted, untrained)."""
    where = Path(location)
    name = where.parent.name if where.name == "final" and where.parent.name else where.name
    source, mixers = config.get("t2r_source"), list(config.get("t2r_mixers") or [])
    targets = sorted(set(mixers) - {"softmax"})
    base = _base_model(source)
    front = ["---", "library_name: transformers", *([f"base_model: {base}"] if base else []),
             "tags:", "  - t2r", "  - linear-attention", *[f"  - {t}" for t in targets], "---", ""]
    rows = [("source", f"`{source}`" + (f" ({SMOLLM2_HUB_ID} as Q4_1 GGUF weights, dequantized)"
                                        if source == "smollm2" else "")),
            ("layers", f"{config.get('model_type')}, {len(mixers)} layers: {_layers(mixers)}"),
            ("target options", _options(config.get("t2r_options") or {})),
            ("made by", f"`{made_by}`")]
    if training is None:
        rows.append(("training", "none: freshly converted; its new layers compute something else than softmax "
                                 "attention until finetuned (`t2r finetune`)"))
    else:
        held = training.get("held_out_loss")
        rows += [("recipe", f"`{training['recipe']}` (resolved in `recipe.yaml` here); stages: "
                            + ", ".join(training.get("stages") or []) or "-"),
                 ("trained", f"{training['steps']:,} steps, {training['tokens']:,} tokens of `{training.get('data')}`"),
                 ("held-out loss", "-" if held is None else f"{held:.3f}")]
    lines = front + [f"# {name}", "", f"`{source}` with {', '.join(targets) or 'no'} layers in place of softmax "
                     "attention, converted by t2r (pretrained Transformers to linear-time RNNs).", "",
                     "| | |", "|---|---|", *[f"| {k} | {v} |" for k, v in rows], "",
                     "## Use", "", "```python", "import t2r  # registers the converted model types",
                     "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
                     f'model = AutoModelForCausalLM.from_pretrained("{location}")',
                     f'tokenizer = AutoTokenizer.from_pretrained("{location}")', "```", "",
                     f"or `t2r generate --model {location} --prompt ...`; `t2r eval --model {location} --out report/` "
                     "compares it with its source.", ""]
    return "\n".join(lines)


def write_model_card(directory, made_by: str, training: dict | None = None, location=None) -> Path:
    """Write `directory/README.md` from its config.json (see `card_text`) for a model that will be loaded from
    `location` (default `directory`; a model written aside and renamed into place names its final place)."""
    directory = Path(directory)
    config = json.loads((directory / "config.json").read_text())
    path = directory / CARD
    path.write_text(card_text(config, str(location or directory), made_by, training))
    return path


def add_evaluation(directory, lines: list[str], report: str) -> Path | None:
    """Put (or replace) the card's evaluation section: `lines` (the report's summary) and where `report` is;
    None when the directory has no card."""
    path = Path(directory) / CARD
    if not path.is_file():
        return None
    text = path.read_text().split(f"\n{EVALUATION}\n")[0].rstrip("\n")
    path.write_text(f"{text}\n\n{EVALUATION}\n\nAgainst its source (`{report}`):\n\n" + "\n".join(lines) + "\n")
    return path
