"""Multi-query associative recall (MQAR; Arora et al. 2024, "Zoology") learned from scratch by a tiny model per
mixer, every recurrent mixer with the same state size: a sanity check that a mixer can learn to recall, not a claim
about converted models.

Each sequence holds N key-value pairs `k1 v1 ... kN vN` (distinct keys), then the N keys again in another order,
each followed by its value: `q1 a1 ... qN aN`. The loss and the accuracy count only the answers a_i (predicted at
q_i). A 2-layer Llama with random weights is converted to each target (`t2r.convert`) and trained in full.

    python benchmarks/recall_from_scratch.py --steps 1000 --pairs 8
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

import t2r

NUM_KEYS = 64  # key tokens 0..63, value tokens 64..127


def mqar_batch(batch: int, pairs: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """ids `[batch, 4 pairs]` and the positions `[pairs]` whose next token is an answer."""
    keys = torch.stack([torch.randperm(NUM_KEYS, generator=generator)[:pairs] for _ in range(batch)])
    values = torch.randint(NUM_KEYS, 2 * NUM_KEYS, (batch, pairs), generator=generator)
    order = torch.stack([torch.randperm(pairs, generator=generator) for _ in range(batch)])
    context = torch.stack([keys, values], -1).flatten(1)
    queries = torch.stack([keys.gather(1, order), values.gather(1, order)], -1).flatten(1)
    return torch.cat([context, queries], 1), torch.arange(2 * pairs, 4 * pairs, 2)


def tiny_model(target: str, options: dict, head_dim: int, seed: int):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=2 * NUM_KEYS, hidden_size=2 * head_dim, intermediate_size=4 * head_dim,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, head_dim=head_dim,
                         max_position_embeddings=1024, tie_word_embeddings=True)
    source = LlamaForCausalLM(config)
    return source if target == "softmax" else t2r.convert(source, target, **options)


def answer_loss(model, ids, answers):
    logits = model(ids, use_cache=False).logits[:, answers]
    targets = ids[:, answers + 1]
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten()), (logits.argmax(-1) == targets).float().mean()


def train(model, steps: int, batch: int, pairs: int, lr: float, seed: int) -> float:
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, betas=(0.9, 0.98))
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min((s + 1) / warmup, 0.5 * (
        1 + math.cos(math.pi * min(s, steps) / steps))))
    model.train()
    for _ in range(steps):
        loss, _ = answer_loss(model, *mqar_batch(batch, pairs, generator))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
    return loss.item()


@torch.no_grad()
def evaluate(model, pairs: int, rows: int = 512) -> float:
    model.eval()
    ids, answers = mqar_batch(rows, pairs, torch.Generator().manual_seed(12345))  # the same held-out rows for all
    return answer_loss(model, ids, answers)[1].item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    d = args.head_dim
    # the same recurrent state per kv head: d x d for gla / gdn, two d x M for gsa with M = d / 2
    rows = [("softmax", {}), ("gla", {}), ("gsa", {"num_slots": d // 2}), ("gdn", {}), ("gdn", {"conv_size": 0})]
    title = (f"MQAR from scratch: {args.pairs} pairs ({4 * args.pairs} tokens), 2 layers, 2 heads of {d}, "
             f"{args.steps} steps of {args.batch} sequences, AdamW lr {args.lr}; accuracy on 512 held-out sequences")
    header = ("| mixer | options | state floats per head | parameters | final train loss | recall accuracy "
              "| train time s |")
    lines = [title, "", header, "|---|---|---|---|---|---|---|"]
    for target, options in rows:
        model = tiny_model(target, options, d, args.seed)
        started = time.time()
        loss = train(model, args.steps, args.batch, args.pairs, args.lr, args.seed)
        seconds = time.time() - started
        accuracy = evaluate(model, args.pairs)
        conv = 9 * d if target == "gdn" and options.get("conv_size", 4) else 0  # 3 inputs of q, k, v per head
        state = "grows (K/V)" if target == "softmax" else (
            f"{2 * d * options['num_slots']}" if target == "gsa"
            else f"{d * d}" + (f" + {conv} (conv)" if conv else ""))
        parameters = sum(p.numel() for p in model.parameters())
        described = ", ".join(f"{k}={v}" for k, v in options.items()) or "defaults"
        lines.append(f"| {target} | {described} | {state} | {parameters:,} | {loss:.3f} | {accuracy:.3f} "
                     f"| {seconds:.0f} |")
        print(lines[-1], flush=True)
    table = "\n".join(lines)
    print(table)
    out = Path(__file__).parent / "results" / f"recall_from_scratch_{args.pairs}pairs.md"
    out.write_text(table + f"\n\nCommand: python benchmarks/recall_from_scratch.py --steps {args.steps} --batch "
                   f"{args.batch} --pairs {args.pairs} --head-dim {d} --lr {args.lr} --seed {args.seed} "
                   f"({torch.get_num_threads()} CPU threads)\n")


if __name__ == "__main__":
    main()
