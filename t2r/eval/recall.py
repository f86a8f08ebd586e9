"""Synthetic recall, seeded, in the model's own tokenizer: multi-query associative recall and passkey retrieval.

Both are scored teacher-forced: an answer counts when the model's argmax predicts every answer token given
the true prefix, which is exactly when greedy decoding would write the answer, at one forward per example.

- MQAR (Arora et al. 2023, "Zoology"): `key: value` pairs of single-token words, then the keys again in
  another order; the model must complete each with its value. Accuracy over all queries.
- Passkey (Mohtashami & Jaggi 2023): a number hidden at some depth in filler text, asked for at the end.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from .contenders import Contender
from .progress import Step
from .result_cache import NO_CACHE, ResultCache, digest

FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
MQAR_PREFIX = "Remember the word that follows each word.\n"


@dataclass
class RecallExample:
    """Token ids of one prompt and the answer tokens to check: `answers[i]` are the positions whose token
    must be predicted (from the position before it)."""

    ids: list[int]
    answers: list[list[int]]


def word_tokens(tokenizer, count: int, seed: int) -> list[int]:
    """`count` distinct tokens that are a space plus a lowercase word of 3-8 letters, and tokenize back to
    themselves alone (so a pair reads as plain text)."""
    vocab = tokenizer.get_vocab()
    candidates = []
    for token_id in sorted(vocab.values()):
        text = tokenizer.decode([token_id], clean_up_tokenization_spaces=False)
        word = text[1:]
        if text.startswith(" ") and 3 <= len(word) <= 8 and word.isascii() and word.isalpha() and word.islower():
            if tokenizer(text, add_special_tokens=False)["input_ids"] == [token_id]:
                candidates.append(token_id)
    if len(candidates) < count:
        raise ValueError(f"the tokenizer has only {len(candidates)} single-token words; recall needs {count}")
    return random.Random(seed).sample(candidates, count)


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _with_bos(tokenizer, ids: list[int]) -> list[int]:
    bos = tokenizer.bos_token_id
    return ([bos] if bos is not None and getattr(tokenizer, "add_bos_token", True) else []) + ids


def mqar_examples(tokenizer, num_pairs: int, count: int, seed: int = 0) -> list[RecallExample]:
    """`count` prompts of `num_pairs` `key: value` lines, then every key again (shuffled) to complete."""
    rng = random.Random(seed)
    pool = word_tokens(tokenizer, max(4 * num_pairs, 64), seed)
    colon, newline = _encode(tokenizer, ":"), _encode(tokenizer, "\n")
    examples = []
    for _ in range(count):
        chosen = rng.sample(pool, 2 * num_pairs)
        keys, values = chosen[:num_pairs], chosen[num_pairs:]
        ids = _with_bos(tokenizer, _encode(tokenizer, MQAR_PREFIX))
        for k, v in zip(keys, values):
            ids += [k, *colon, v, *newline]
        ids += newline
        answers = []
        for i in rng.sample(range(num_pairs), num_pairs):
            ids += [keys[i], *colon]
            answers.append([len(ids)])
            ids += [values[i], *newline]
        examples.append(RecallExample(ids, answers))
    return examples


def passkey_examples(tokenizer, length: int, depth: float, count: int, seed: int = 0,
                     digits: int = 5) -> list[RecallExample]:
    """`count` prompts of exactly `length` tokens with a `digits`-digit pass key at `depth` (0 = start, 1 = end)."""
    rng = random.Random(f"{seed}-{length}-{depth}")
    head = _with_bos(tokenizer, _encode(tokenizer, "There is a pass key hidden in a lot of irrelevant text. "
                                                   "Find it and remember it.\n"))
    filler = _encode(tokenizer, FILLER)
    question = _encode(tokenizer, "\nWhat is the pass key? The pass key is")
    examples = []
    for _ in range(count):
        key = _encode(tokenizer, " " + "".join(rng.choice("0123456789") for _ in range(digits)))
        needle = (_encode(tokenizer, " The pass key is") + key + _encode(tokenizer, ". Remember it. The pass key is")
                  + key + _encode(tokenizer, "."))
        budget = length - len(head) - len(needle) - len(question) - len(key)
        if budget < 0:
            raise ValueError(f"passkey length {length} is too short for the prompt ({length - budget} tokens)")
        body = (filler * (budget // len(filler) + 1))[:budget]
        # between filler blocks, the nearest to `depth`; at depth 1 after all the filler
        cut = budget if depth >= 1 else min(round(depth * budget / len(filler)) * len(filler), budget)
        ids = head + body[:cut] + needle + body[cut:] + question
        answers = [list(range(len(ids), len(ids) + len(key)))]
        examples.append(RecallExample(ids + key, answers))
    return examples


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
