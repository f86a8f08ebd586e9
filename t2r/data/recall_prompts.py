"""Synthetic recall prompts, seeded, in the model's own tokenizer: multi-query associative recall and passkey
retrieval (scored by `t2r.eval.recall`; read by the recall-aware layer ranking, `t2r.convert.sensitivity`).

- MQAR (Arora et al. 2023, "Zoology"): `key: value` pairs of single-token words, then the keys again in
  another order; the model must complete each with its value.
- Passkey (Mohtashami & Jaggi 2023): a number hidden at some depth in filler text, asked for at the end.
"""

from __future__ import annotations

import random
import weakref
from dataclasses import dataclass

import torch

FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
MQAR_PREFIX = "Remember the word that follows each word.\n"


@dataclass
class RecallExample:
    """Token ids of one prompt and the answer tokens to check: `answers[i]` are the positions whose token
    must be predicted (from the position before it)."""

    ids: list[int]
    answers: list[list[int]]


_WORDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> its single-token words


def single_token_words(tokenizer) -> list[int]:
    """The tokens that are a space plus a lowercase word of 3-8 letters and tokenize back to themselves alone (so
    a pair reads as plain text), in id order; read from the vocabulary once per tokenizer (a scan of SmolLM2's
    49K tokens takes ~1 s, and a run checks them before training, then draws prompts of several sizes)."""
    if tokenizer in _WORDS:
        return _WORDS[tokenizer]
    candidates = []
    for token_id in sorted(tokenizer.get_vocab().values()):
        text = tokenizer.decode([token_id], clean_up_tokenization_spaces=False)
        word = text[1:]
        if text.startswith(" ") and 3 <= len(word) <= 8 and word.isascii() and word.isalpha() and word.islower():
            if tokenizer(text, add_special_tokens=False)["input_ids"] == [token_id]:
                candidates.append(token_id)
    _WORDS[tokenizer] = candidates
    return candidates


def word_tokens(tokenizer, count: int, seed: int) -> list[int]:
    """`count` distinct single-token words (`single_token_words`), drawn with `seed`."""
    candidates = single_token_words(tokenizer)
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


def answer_rows(examples: list[RecallExample]) -> tuple[torch.Tensor, torch.Tensor]:
    """`(ids [N, width], answer mask [N, width])`, right-padded: the mask marks the answer tokens (each to be
    predicted from the position before it)."""
    width = max(len(e.ids) for e in examples)
    ids = torch.zeros(len(examples), width, dtype=torch.long)
    mask = torch.zeros(len(examples), width, dtype=torch.bool)
    for row, e in enumerate(examples):
        ids[row, :len(e.ids)] = torch.tensor(e.ids)
        for positions in e.answers:
            mask[row, positions] = True
    return ids, mask
