"""What each quality lever buys, at conversion and after a short alignment: KL(source || model) per token and
perplexity by position on held-out text, before and after the same attention-transfer budget, side by side.

Levers: window + sinks inside each converted layer, teacher-informed gate init, the hybrid's softmax layers
chosen by measured sensitivity vs by position. Alignment is stage 1 of LoLCATs (`t2r.train.transfer`): every
converted layer learns its source attention's output on the source's hidden states, `--align-steps` batches of
`--batch` rows of `--length` tokens (documents joined by EOS), the same rows for every variant.

    python benchmarks/levers.py --model smollm2 --train ../shared/data/corpus/train-00.jsonl.gz \
        --held-out ../shared/data/corpus/validation-00.jsonl.gz --length 1024 --align-steps 200 --batch 8
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import t2r
from t2r.convert.lookback import attention_lookback
from t2r.convert.sensitivity import kl_to_reference, rank_layers
from t2r.data.config import DataConfig
from t2r.data.rows import token_rows
from t2r.optim import build_optimizer
from t2r.sources import load_source
from t2r.train.transfer import AttentionTargets

VARIANTS = {  # name: (target, convert options, softmax-layer choice)
    "gsa": ("gsa", {}, None),
    "gsa + window 64 + 4 sinks": ("gsa", {"window": 64, "sinks": 4}, None),
    "gla": ("gla", {}, None),
    "gla, teacher init": ("gla", {"init": "teacher"}, None),
    "gsa, 2 softmax layers by sensitivity": ("gsa", {}, "sensitivity"),
    "gsa, 2 softmax layers evenly spaced": ("gsa", {}, "even"),
}
EDGES = (0, 64, 256, 1024, 4096, 16384)


def nll_by_position(model, ids: torch.Tensor, batch: int) -> torch.Tensor:
    """`[rows, T-1]` token NLL."""
    device = next(model.parameters()).device
    out = []
    with torch.no_grad():
        for start in range(0, len(ids), batch):
            rows = ids[start:start + batch].to(device)
            logits = model(rows, use_cache=False).logits[:, :-1].float()
            out.append(F.cross_entropy(logits.transpose(1, 2), rows[:, 1:], reduction="none").cpu())
    return torch.cat(out)


def align(model, source, batches, steps: int, lr: float, autocast) -> None:
    """`steps` optimizer steps of the attention MSE (an align stage's loss) on the converted attention modules."""
    targets = AttentionTargets(model, source)
    optimizer = build_optimizer([p for _, s, _ in targets.pairs for p in s.parameters()], lr, weight_decay=0.0)
    for _, batch in zip(range(steps), batches):
        with autocast():
            with torch.no_grad():
                source(**batch)
            targets.mse().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    targets.close()


def bucket_ppl(nll: torch.Tensor) -> list[float]:
    positions = torch.arange(1, nll.shape[1] + 1)
    return [nll[:, (positions >= lo) & (positions < hi)].mean().exp().item()
            for lo, hi in zip(EDGES, EDGES[1:]) if lo < nll.shape[1]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--train", required=True, help="text to align on (and to rank layers / measure look-back)")
    parser.add_argument("--held-out", required=True, help="text to score on")
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--rows", type=int, default=8, help="held-out rows scored")
    parser.add_argument("--align-steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--softmax", type=int, default=2, help="softmax layers kept in the hybrids")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    source, tokenizer = load_source(args.model, dtype=torch.float32)
    source = source.to(device).eval()
    train_data, held_out_data = DataConfig(path=args.train), DataConfig(path=args.held_out)
    align_rows = token_rows(train_data, tokenizer, args.length, args.align_steps * args.batch, pack=True, part="train")
    held_out = token_rows(held_out_data, tokenizer, args.length, args.rows, seed=1, pack=True, part="train")
    calibration = align_rows[:4, :512]
    autocast = (lambda: torch.autocast("cuda", dtype=dtype)) if device == "cuda" else None
    reference = [F.log_softmax(source(held_out[i:i + 4].to(device), use_cache=False).logits[:, :-1].float(), -1)
                 for i in range(0, len(held_out), 4)]
    layers = source.config.num_hidden_layers
    lines = [f"{args.model}: KL(source || model) nats/token and perplexity by position on {args.rows} held-out rows of "
             f"{args.length} tokens, at conversion and after attention transfer ({args.align_steps} steps x "
             f"{args.batch} rows x {args.length} tokens = {args.align_steps * args.batch * args.length:,} tokens, "
             f"lr {args.lr}), {torch.cuda.get_device_name() if device == 'cuda' else 'CPU'}",
             "", "| variant | KL at conversion | KL aligned | ppl aligned by position "
             + " / ".join(f"{lo}-{min(hi, args.length)}" for lo, hi in zip(EDGES, EDGES[1:]) if lo < args.length)
             + " | align s |",
             "|---|---|---|---|---|"]
    source_ppl = bucket_ppl(nll_by_position(source, held_out, 4))
    lines.append(f"| source | 0 | 0 | {' / '.join(f'{p:.1f}' for p in source_ppl)} | |")
    print(lines[-1], flush=True)
    ranking = lookback = None
    for name in args.variants:
        target, options, choice = VARIANTS[name]
        options = dict(options)
        convert_layers = None
        if choice == "sensitivity":
            ranking = ranking or rank_layers(source, target, calibration, progress=False)
            kept = ranking.most_sensitive(args.softmax)
            convert_layers = [i for i in range(layers) if i not in kept]
        elif choice == "even":
            kept = [layers - 1 - round(i * layers / args.softmax) for i in range(args.softmax)]
            convert_layers = [i for i in range(layers) if i not in kept]
        if options.pop("init", None) == "teacher":
            lookback = attention_lookback(source, calibration.to(device)) if lookback is None else lookback
            options["lookback"] = lookback
        model = t2r.convert(source, target, layers=convert_layers, **options).to(device)
        kl_before = kl_to_reference(model.eval(), held_out, reference, 4)
        batches = ({"input_ids": align_rows[i:i + args.batch].to(device)}
                   for i in range(0, len(align_rows), args.batch))
        model.train()
        started = time.perf_counter()
        align(model, source, batches, args.align_steps, args.lr, autocast)
        seconds = time.perf_counter() - started
        model.eval()
        kl_after = kl_to_reference(model, held_out, reference, 4)
        ppl = bucket_ppl(nll_by_position(model, held_out, 4))
        label = name if choice is None else f"{name} (softmax {sorted(kept)})"
        lines.append(f"| {label} | {kl_before:.2f} | {kl_after:.2f} | {' / '.join(f'{p:.1f}' for p in ppl)} | "
                     f"{seconds:.0f} |")
        print(lines[-1], flush=True)
        del model
    lines += ["", "Command: python " + shlex.join(sys.argv)]
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
