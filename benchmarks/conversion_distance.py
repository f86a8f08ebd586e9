"""How far a freshly converted model is from its source, before any finetuning: KL(source || converted)
per token and the converted model's NLL, for each target and a few options. Used to choose defaults.

    python benchmarks/conversion_distance.py --model smollm2 --text-file ../shared/data/corpus/validation-00.jsonl.gz
    python benchmarks/conversion_distance.py --set gdn --rows 4 --tokens 256 --text-file ...   # gdn's defaults

`--set gdn` compares gdn's options (and its start beta and scale on q, set after conversion) with gsa, gla and
retnet, with and without a window of 64 tokens + 4 sinks. With a window every target starts as the source's
attention over window + sinks (the state's gain starts at 0), so those rows measure the window alone.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import time
from pathlib import Path

import torch

import t2r
from t2r.sources import load_source

VARIANTS = [
    ("gsa", {}), ("gsa", {"rope": True}), ("gsa", {"feature_map": "identity"}),
    ("gla", {}), ("gla", {"rope": True}), ("gla", {"denominator": False, "output_norm": True}),
    ("retnet", {}), ("retnet", {"rope": True}), ("retnet", {"denominator": False, "output_norm": True}),
    ("retnet", {"denominator": False}), ("retnet", {"feature_map": "elu1"}),
    ("fox", {}), ("fox", {"rope": False}),
    ("gla", {"init": "teacher"}), ("fox", {"init": "teacher"}),   # with --teacher-text only
]
WINDOW = {"window": 64, "sinks": 4}
GDN_VARIANTS = [
    ("gsa", {}), ("gla", {}), ("retnet", {}),
    ("gdn", {}), ("gdn", {"output_norm": True}), ("gdn", {"feature_map": "identity"}),
    ("gdn", {"feature_map": "identity", "output_norm": True}), ("gdn", {"rope": True}),
    ("gdn", {"read_scale": 0.125}), ("gdn", {"read_scale": 2.0}), ("gdn", {"beta_start": 0.25}),
    ("gdn", {"beta_start": 0.9}),
    ("gsa", WINDOW), ("gla", WINDOW), ("retnet", WINDOW), ("gdn", WINDOW),
    ("gla", {"init": "teacher"}), ("gdn", {"init": "teacher"}),   # with --teacher-text only
]
AFTER_CONVERSION = ("init", "beta_start", "read_scale")
"""Not options: set on the converted model (gdn's starting beta, its scale on q)."""
SETS = {"all": VARIANTS, "gdn": GDN_VARIANTS}


def read_rows(path: str, tokenizer, rows: int, tokens: int) -> torch.Tensor:
    """`[rows, tokens]`: the first `rows` documents of a JSONL(.gz) file with at least `tokens` tokens, cut there."""
    kept = []
    with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
        for line in f:
            ids = tokenizer(json.loads(line)["text"], return_tensors="pt")["input_ids"][0]
            if len(ids) >= tokens:
                kept.append(ids[:tokens])
            if len(kept) == rows:
                return torch.stack(kept)
    raise ValueError(f"{path} has only {len(kept)} documents of {tokens} tokens or more; "
                     "ask for fewer --rows or --tokens")


def set_after_conversion(model, options: dict) -> None:
    """gdn: `beta_start`, every layer's starting write strength (its bias at logit(beta)) instead of 1/2;
    `read_scale`, the scale on q instead of 1."""
    for layer in model.converted_layers().values():
        if "beta_start" in options:
            layer.gates.beta_bias.data.fill_(math.log(options["beta_start"] / (1 - options["beta_start"])))
        if "read_scale" in options:
            layer.read_scale = options["read_scale"]


def read_text(path: str, max_chars: int = 200_000) -> str:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        if ".jsonl" in path:
            parts, size = [], 0
            for line in f:
                parts.append(json.loads(line)["text"])
                size += len(parts[-1])
                if size > max_chars:
                    break
            return " ".join(parts)
        return f.read(max_chars)


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--text-file", required=True, help="plain text, or JSONL(.gz) with a 'text' field")
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--rows", type=int, default=0,
                        help="N held-out documents of --tokens tokens each (0: the file's text joined, one sequence)")
    parser.add_argument("--set", choices=sorted(SETS), default="all", help="which rows: all targets, or gdn's options")
    parser.add_argument("--teacher-text", default=None,
                        help="text to measure the source's look-back on for the init=teacher rows (other text than "
                             "--text-file); without it those rows are skipped")
    args = parser.parse_args()
    source, tokenizer = load_source(args.model)
    if args.rows:
        ids = read_rows(args.text_file, tokenizer, args.rows, args.tokens)
    else:
        ids = tokenizer(read_text(args.text_file), return_tensors="pt")["input_ids"][:, : args.tokens]
    reference = source(ids).logits.log_softmax(-1)
    started = time.time()

    def nll(logp):
        return -logp[:, :-1].gather(-1, ids[:, 1:, None]).mean().item()

    rows = [("source", "", 0.0, nll(reference))]
    lookback = None
    if args.teacher_text:
        from t2r.convert import teacher_lookback
        from t2r.data.config import DataConfig

        lookback = teacher_lookback(source, tokenizer, DataConfig(path=args.teacher_text))
    for target, options in SETS[args.set]:
        teacher = options.get("init") == "teacher"
        if teacher and lookback is None:
            continue
        kwargs = {k: v for k, v in options.items() if k not in AFTER_CONVERSION}
        model = t2r.convert(source, target, lookback=lookback if teacher else None, **kwargs)
        set_after_conversion(model, options)
        logp = model(ids).logits.log_softmax(-1)
        kl = torch.nn.functional.kl_div(logp, reference, log_target=True, reduction="none").sum(-1).mean().item()
        rows.append((target, ", ".join(f"{k}={v}" for k, v in options.items()) or "defaults", kl, nll(logp)))
        print(*rows[-1], flush=True)
    shape = f"{ids.shape[0]} rows x {ids.shape[1]} tokens" if args.rows else f"{ids.shape[1]} tokens"
    lines = [f"Distance at conversion, {args.model}, {shape} of {Path(args.text_file).name}", "",
             "| target | options | KL(source || converted) nats/token | NLL nats/token |", "|---|---|---|---|"]
    lines += [f"| {t} | {o} | {kl:.3f} | {n:.3f} |" for t, o, kl, n in rows]
    table = "\n".join(lines)
    print(table)
    suffix = "" if args.set == "all" else f"_{args.set}"
    out = Path(__file__).parent / "results" / f"conversion_distance{suffix}_{args.model.replace('/', '_')}.md"
    flags = (f" --teacher-text {args.teacher_text}" if args.teacher_text else "") + \
        (f" --rows {args.rows}" if args.rows else "") + (f" --set {args.set}" if args.set != "all" else "")
    out.write_text(table + f"\n\nCommand: python benchmarks/conversion_distance.py --model {args.model} "
                   f"--text-file {args.text_file} --tokens {args.tokens}{flags}\n"
                   f"({time.time() - started:.0f} s for the converted rows, {torch.get_num_threads()} CPU threads)\n")


if __name__ == "__main__":
    main()
