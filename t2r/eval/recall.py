"""Synthetic recall, seeded, in the model's own tokenizer: multi-query associative recall and passkey retrieval.

Both are scored teacher-forced: an answer counts when the model's argmax predicts every answer token given
the true prefix, which is exactly when greedy decoding would write the answer, at one forward per example.

- MQAR (Arora et al. 2023, "Zoology"): `key: value` pairs of single-token words, then the keys again in
  another order; the model must complete each with its value. Accuracy over all queries.
- Passkey (Mohtashami & Jaggi 2023): a number hidden at some depth in filler text, asked for at the end.
"""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from t2r.data.recall_prompts import FILLER, MQAR_PREFIX, RecallExample, mqar_examples, passkey_examples, word_tokens

from .contenders import Contender
from .progress import Step
from .result_cache import NO_CACHE, ResultCache, digest

__all__ = ["FILLER", "MQAR_PREFIX", "RecallExample", "mqar_examples", "passkey_examples", "word_tokens",
           "recall_accuracy", "scored_accuracy", "mqar", "passkey"]


@torch.no_grad()
def recall_accuracy(contender: Contender, examples: list[RecallExample], batch_size: int = 1,
                    desc: str = "recall") -> float:
    """Fraction of answers whose every token is the argmax given the true prefix (= greedy exact match)."""
    correct = total = 0
    for start in tqdm(range(0, len(examples), batch_size), desc=f"{desc} {contender.name}", leave=False,
                      disable=None):  # None: no bar when stderr is not a terminal
        batch = examples[start:start + batch_size]
        width = max(len(e.ids) for e in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        for row, e in enumerate(batch):
            ids[row, :len(e.ids)] = torch.tensor(e.ids)  # right padding: causal models never look at it
        predicted = contender.logits(ids).argmax(-1).cpu()
        for row, e in enumerate(batch):
            for positions in e.answers:
                pos = torch.tensor(positions)
                correct += bool((predicted[row, pos - 1] == ids[row, pos]).all())
                total += 1
    return correct / max(total, 1)


def scored_accuracy(contender: Contender, examples: list[RecallExample], batch_size: int, desc: str,
                    cache: ResultCache) -> float:
    """`recall_accuracy`, read from `cache` when stored for these exact prompts."""
    inputs = {"examples": digest([[e.ids, e.answers] for e in examples]), "batch_size": batch_size}
    return cache.score(contender, "recall", inputs, lambda: recall_accuracy(contender, examples, batch_size, desc))


def mqar(contenders: list[Contender], tokenizer, pairs: list[int], count: int, seed: int = 0,
         batch_size: int = 1, cache: ResultCache = NO_CACHE) -> dict:
    """{"pairs": [...], "tokens": [...], "accuracy": {name: [...]}} for each number of pairs."""
    result = {"pairs": list(pairs), "tokens": [], "count": count, "accuracy": {c.name: [] for c in contenders}}
    for n in pairs:
        examples = mqar_examples(tokenizer, n, count, seed)
        result["tokens"].append(len(examples[0].ids))
        with Step(f"mqar {n} pairs ({len(examples[0].ids)} tokens)"):
            for c in contenders:
                result["accuracy"][c.name].append(scored_accuracy(c, examples, batch_size, f"mqar {n}", cache))
    return result


def passkey(contenders: list[Contender], tokenizer, lengths: list[int], depths: list[float], count: int,
            seed: int = 0, batch_size: int = 1, cache: ResultCache = NO_CACHE) -> dict:
    """{"lengths", "depths", "accuracy": {name: [[acc per depth] per length]}}."""
    result = {"lengths": list(lengths), "depths": list(depths), "count": count,
              "accuracy": {c.name: [] for c in contenders}}
    for length in lengths:
        rows = {c.name: [] for c in contenders}
        for depth in depths:
            examples = passkey_examples(tokenizer, length, depth, count, seed)
            with Step(f"passkey {length} tokens, depth {depth:g}"):
                for c in contenders:
                    rows[c.name].append(scored_accuracy(c, examples, batch_size, f"passkey {length}@{depth:g}", cache))
        for name, row in rows.items():
            result["accuracy"][name].append(row)
    return result
