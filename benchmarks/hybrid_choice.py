"""Which layers to keep softmax in a hybrid: ranked by sensitivity (`layers: auto:N`) vs by position.

Ranks the layers on calibration text (training documents), then scores freshly converted hybrids with N softmax
layers chosen by that ranking, evenly spaced, first N and last N, by KL(source || hybrid) per token on other,
held-out text. No training: this is where each choice starts from.

    python benchmarks/hybrid_choice.py --model smollm2 --target gsa --softmax 3 \
        --calibration ../shared/data/corpus/train-00.jsonl.gz --held-out ../shared/data/corpus/validation-00.jsonl.gz
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import t2r
from t2r.convert import calibration_rows, kl_to_reference, rank_layers
from t2r.data.config import DataConfig
from t2r.sources import load_source


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--target", default="gsa")
    parser.add_argument("--softmax", type=int, nargs="+", default=[3])
    parser.add_argument("--calibration", required=True, help="text to rank on")
    parser.add_argument("--held-out", required=True, help="text to score the hybrids on")
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    source, tokenizer = load_source(args.model, dtype=torch.float32)
    source.eval()
    ranking = rank_layers(source, args.target, calibration_rows(tokenizer, DataConfig(path=args.calibration),
                                                                args.rows, args.length))
    held_out = calibration_rows(tokenizer, DataConfig(path=args.held_out), args.rows, args.length, seed=1)
    reference = [F.log_softmax(source(held_out[i:i + 4], use_cache=False).logits[:, :-1].float(), -1)
                 for i in range(0, len(held_out), 4)]
    layers = source.config.num_hidden_layers
    lines = [f"{args.model} -> {args.target}, freshly converted hybrids: KL(source || hybrid) in nats/token on "
             f"{held_out.numel() - len(held_out)} held-out tokens ({args.held_out}); ranking on {args.calibration}",
             "", "| softmax layers | chosen by | layers kept softmax | KL |", "|---|---|---|---|"]
    for n in args.softmax:
        choices = {
            "sensitivity (auto)": ranking.most_sensitive(n),
            "evenly spaced": [layers - 1 - round(i * layers / n) for i in range(n)][::-1],
            "first N": list(range(n)),
            "last N": list(range(layers - n, layers)),
        }
        for how, kept in choices.items():
            hybrid = t2r.convert(source, args.target, layers=[i for i in range(layers) if i not in kept]).eval()
            kl = kl_to_reference(hybrid, held_out, reference, 4)
            lines.append(f"| {n} | {how} | {sorted(kept)} | {kl:.3f} |")
            print(lines[-1], flush=True)
            del hybrid
    all_converted = t2r.convert(source, args.target).eval()
    lines.append(f"| 0 | (all converted) | [] | {kl_to_reference(all_converted, held_out, reference, 4):.3f} |")
    lines += ["", "Command: python " + " ".join(sys.argv)]
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
