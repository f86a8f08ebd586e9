"""How far a freshly converted model is from its source, before any finetuning: KL(source || converted)
per token and the converted model's NLL, for each target and a few options. Used to choose defaults.

    python benchmarks/conversion_distance.py --model smollm2 --text-file ../shared/data/corpus/validation-00.jsonl.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
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
    parser.add_argument("--teacher-text", default=None,
                        help="text to measure the source's look-back on for the init=teacher rows (other text than "
                             "--text-file); without it those rows are skipped")
    args = parser.parse_args()
    source, tokenizer = load_source(args.model)
    ids = tokenizer(read_text(args.text_file), return_tensors="pt")["input_ids"][:, : args.tokens]
    reference = source(ids).logits.log_softmax(-1)

    def nll(logp):
        return -logp[0, :-1].gather(-1, ids[0, 1:, None]).mean().item()

    rows = [("source", "", 0.0, nll(reference))]
    lookback = None
    if args.teacher_text:
        from t2r.convert import teacher_lookback
        from t2r.data.config import DataConfig

        lookback = teacher_lookback(source, tokenizer, DataConfig(path=args.teacher_text))
    for target, options in VARIANTS:
        teacher = options.get("init") == "teacher"
        if teacher and lookback is None:
            continue
        kwargs = {k: v for k, v in options.items() if k != "init"}
        logp = t2r.convert(source, target, lookback=lookback if teacher else None, **kwargs)(ids).logits.log_softmax(-1)
        kl = torch.nn.functional.kl_div(logp, reference, log_target=True, reduction="none").sum(-1).mean().item()
        rows.append((target, ", ".join(f"{k}={v}" for k, v in options.items()) or "defaults", kl, nll(logp)))
    lines = [f"Distance at conversion, {args.model}, {ids.shape[1]} tokens of {Path(args.text_file).name}", "",
             "| target | options | KL(source || converted) nats/token | NLL nats/token |", "|---|---|---|---|"]
    lines += [f"| {t} | {o} | {kl:.3f} | {n:.3f} |" for t, o, kl, n in rows]
    table = "\n".join(lines)
    print(table)
    out = Path(__file__).parent / "results" / f"conversion_distance_{args.model.replace('/', '_')}.md"
    teacher_flag = f" --teacher-text {args.teacher_text}" if args.teacher_text else ""
    out.write_text(table + f"\n\nCommand: python benchmarks/conversion_distance.py --model {args.model} "
                   f"--text-file {args.text_file} --tokens {args.tokens}{teacher_flag}\n")


if __name__ == "__main__":
    main()
