"""A plain reference scorer for local multiple-choice JSONL files (`{"query", "choices", "gold"}` per line).

It tokenises and scores exactly as lm-eval's HFLM does for a causal model, so `run_harness` on a local task must
agree with it: trailing whitespace of the context moves to the continuation, context+continuation is encoded
whole and split after the context's own encoding (so a token that straddles the boundary counts as
continuation), special tokens follow the tokenizer's default (BOS for Llama/Mistral, none for GPT-2-style and
Qwen2), and the log-probability of a continuation is the sum over its tokens. `acc` picks the highest sum,
`acc_norm` the highest sum per character of the choice (lm-eval's acc_norm: `len(choice)`, characters),
`acc_bytes` per UTF-8 byte.
"""

from __future__ import annotations

import json
import os

import torch
import torch.nn.functional as F


def _encode(tokenizer, text: str, prefix_text: str | None) -> list[int]:
    """HFLM.tok_encode: the tokenizer's default special tokens, unless the text already starts with the prefix
    (BOS, or EOS when there is no BOS) token's text."""
    if prefix_text and text.startswith(prefix_text):
        return tokenizer.encode(text, add_special_tokens=False)
    return tokenizer.encode(text)


def _prefix_token_id(tokenizer) -> int | None:
    return tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id


def encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) as lm-eval encodes a loglikelihood request for a causal model."""
    prefix_id = _prefix_token_id(tokenizer)
    prefix_text = tokenizer.decode(prefix_id) if prefix_id is not None else None
    if context == "":  # lm-eval conditions on the prefix token alone
        cont = tokenizer.encode(continuation, add_special_tokens=False)
        return ([prefix_id], cont) if prefix_id != cont[0] else (cont[:1], cont[1:])
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    whole = _encode(tokenizer, context + continuation, prefix_text)
    context_ids = _encode(tokenizer, context, prefix_text)
    return context_ids, whole[len(context_ids):]


@torch.no_grad()
def loglikelihoods(model, tokenizer, context: str, continuations: list[str],
                   max_length: int | None = None) -> list[float]:
    """Sum of log-probabilities of each continuation's tokens given `context`, all choices in one right-padded
    forward (no attention mask: the model must be causal). `max_length` left-truncates like lm-eval."""
    pairs = [encode_pair(tokenizer, context, c) for c in continuations]
    rows, spans = [], []
    for ctx, cont in pairs:
        if not cont:
            raise ValueError(f"continuation encodes to no tokens after context {context!r}")
        ids = ctx + cont
        if max_length is not None:
            ids = ids[-(max_length + 1):]
        rows.append(ids[:-1])  # predict every token after the first
        spans.append(cont)
    device = next(model.parameters()).device
    width = max(len(r) for r in rows)
    batch = torch.zeros(len(rows), width, dtype=torch.long, device=device)  # lm-eval pads with id 0 too
    for i, row in enumerate(rows):
        batch[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    logprobs = F.log_softmax(model(batch).logits.float(), dim=-1)
    scores = []
    for i, (row, cont) in enumerate(zip(rows, spans)):
        positions = torch.arange(len(row) - len(cont), len(row), device=device)
        targets = torch.tensor(cont, dtype=torch.long, device=device)
        scores.append(float(logprobs[i, positions, targets].sum()))
    return scores


def _argmax(values) -> int:
    return max(range(len(values)), key=lambda i: values[i])  # first maximum, as numpy.argmax


def read_items(path: str | os.PathLike, limit: int | None = None) -> list[dict]:
    items = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                items.append(json.loads(line))
                if limit is not None and len(items) >= limit:
                    break
    return items


def score_multiple_choice(model, tokenizer, path: str | os.PathLike, limit: int | None = None,
                          max_length: int | None = None) -> dict:
    """{"acc", "acc_norm", "acc_bytes", "n"} of `model` on the first `limit` items of a local JSONL file."""
    items = read_items(path, limit)
    if not items:
        raise ValueError(f"no items in {path}")
    was_training = model.training
    model.eval()
    hits = {"acc": 0, "acc_norm": 0, "acc_bytes": 0}
    try:
        for item in items:
            choices, gold = item["choices"], int(item["gold"])
            lls = loglikelihoods(model, tokenizer, item["query"], choices, max_length=max_length)
            hits["acc"] += _argmax(lls) == gold
            hits["acc_norm"] += _argmax([ll / len(c) for ll, c in zip(lls, choices)]) == gold
            hits["acc_bytes"] += _argmax([ll / len(c.encode("utf-8")) for ll, c in zip(lls, choices)]) == gold
    finally:
        model.train(was_training)
    return {**{k: v / len(items) for k, v in hits.items()}, "n": len(items)}
