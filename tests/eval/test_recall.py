"""Synthetic recall (`t2r.eval.recall`): MQAR and passkey prompts, teacher-forced exact-match scoring, and (slow)
what a real source model, a freshly converted one and a short window score on them."""

import pytest
import torch

import t2r
from t2r.eval.contenders import Contender
from t2r.eval.recall import (
    FILLER,
    MQAR_PREFIX,
    RecallExample,
    mqar,
    mqar_examples,
    passkey,
    passkey_examples,
    recall_accuracy,
    word_tokens,
)
from tests.helpers.data import char_tokenizer

HEAD = "There is a pass key hidden in a lot of irrelevant text. Find it and remember it.\n"
QUESTION = "\nWhat is the pass key? The pass key is"


def needle(key: str) -> str:
    return f" The pass key is {key}. Remember it. The pass key is {key}."


def find(ids: list[int], part: list[int]) -> int:
    """Index of the first occurrence of `part` in `ids` (-1 if absent)."""
    return next((i for i in range(len(ids) - len(part) + 1) if ids[i:i + len(part)] == part), -1)


# --- without single-token words ---------------------------------------------------------------------------------

def test_word_tokens_needs_single_token_words():
    tok = char_tokenizer()  # one character per token: no " word" token at all
    with pytest.raises(ValueError, match="only 0 single-token words; recall needs 4"):
        word_tokens(tok, 4, seed=0)
    with pytest.raises(ValueError, match="single-token words"):
        mqar_examples(tok, num_pairs=4, count=1)


# --- passkey prompts (a character tokenizer is enough: no words needed) -----------------------------------------

def check_passkey_layout(tok, example: RecallExample, depth: float, prefix: str = ""):
    """The prompt reads HEAD, whole filler sentences, the needle, more filler, the question, then the key; the
    answer is the key's tokens at the very end; returns the needle's depth (its position / the length)."""
    text = tok.decode(example.ids)
    assert len(example.answers) == 1
    answer = example.answers[0]
    assert answer == list(range(len(example.ids) - len(answer), len(example.ids)))  # the last tokens
    key_text = tok.decode([example.ids[p] for p in answer])
    key = key_text.strip()
    assert key_text.startswith(" ") and len(key) == 5 and key.isdigit()
    assert text.startswith(prefix + HEAD) and text.endswith(QUESTION + key_text)
    body_and_needle = text[len(prefix + HEAD):-len(QUESTION + key_text)]
    before, hit, after = body_and_needle.partition(needle(key))
    assert hit, text
    repeats = len(before) // len(FILLER)
    if depth < 1:
        assert before == FILLER * repeats  # the needle sits between filler sentences
        assert (FILLER * (len(after) // len(FILLER) + 2)).startswith(after)  # the rest is filler, cut at the end
    else:  # depth 1: all the filler (cut to fit, possibly mid-sentence), then the needle, then the question
        assert after == "" and (FILLER * (repeats + 2)).startswith(before) and repeats >= 1
    # the key's tokens first appear in the needle; its position over the length is the needle's depth
    key_ids = [example.ids[p] for p in answer]
    return find(example.ids, key_ids) / len(example.ids)


@pytest.mark.parametrize("depth", [0, 0.25, 0.5, 0.75, 1])
def test_passkey_examples_layout_length_and_depth(depth):
    tok = char_tokenizer()
    length = 2000  # characters: the filler (90 characters) is fine-grained enough for a depth within 0.1
    examples = passkey_examples(tok, length, depth, count=3, seed=0)
    assert len(examples) == 3
    keys = set()
    for example in examples:
        assert len(example.ids) == length  # the filler takes exactly the room left
        measured = check_passkey_layout(tok, example, depth)
        assert abs(measured - depth) <= 0.1, (depth, measured)
        keys.add(tuple(example.ids[-5:]))
    assert len(keys) > 1  # a new key per example


def test_passkey_examples_are_seeded():
    tok = char_tokenizer()
    a = passkey_examples(tok, 600, 0.5, count=4, seed=0)
    b = passkey_examples(tok, 600, 0.5, count=4, seed=0)
    c = passkey_examples(tok, 600, 0.5, count=4, seed=1)
    assert [(e.ids, e.answers) for e in a] == [(e.ids, e.answers) for e in b]
    assert [e.ids for e in a] != [e.ids for e in c]


def test_passkey_examples_too_short_raises():
    with pytest.raises(ValueError, match="too short"):
        passkey_examples(char_tokenizer(), 100, 0.5, count=1)


# --- recall_accuracy: exact match of every answer token, teacher-forced ------------------------------------------

class FakeContender:
    """Predicts the true next token everywhere (one-hot logits), except at the (row marker, position) pairs
    in `wrong`, where it predicts another token. Rows are told apart by their first token (the marker)."""

    name = "fake"

    def __init__(self, wrong: set[tuple[int, int]], vocab: int = 50):
        self.wrong, self.vocab, self.calls = wrong, vocab, []

    def logits(self, input_ids):
        self.calls.append(tuple(input_ids.shape))
        B, T = input_ids.shape
        predicted = torch.zeros(B, T, dtype=torch.long)
        predicted[:, :-1] = input_ids[:, 1:]  # logits at t predict token t + 1
        for row in range(B):
            marker = int(input_ids[row, 0])
            for t in range(T - 1):
                if (marker, t + 1) in self.wrong:  # the prediction *of* token t + 1 is wrong
                    predicted[row, t] = (input_ids[row, t + 1] + 1) % self.vocab
        return torch.nn.functional.one_hot(predicted, self.vocab).float()


def fake_examples():
    g = torch.Generator().manual_seed(0)
    ids = lambda marker, n: [marker] + torch.randint(10, 50, (n - 1,), generator=g).tolist()  # noqa: E731
    return [
        RecallExample(ids(1, 20), [[5], [8, 9, 10, 11, 12], [15]]),  # 3 answers
        RecallExample(ids(2, 12), [[3], [6, 7]]),                     # 2 answers
        RecallExample(ids(3, 16), [[4, 5, 6, 7, 8]]),                 # 1 answer
        RecallExample(ids(4, 9), [[8]]),                              # 1 answer, the last token
    ]


@pytest.mark.parametrize("batch_size", [1, 2, 3, 4])
def test_recall_accuracy_is_exact_match_per_answer(batch_size):
    examples = fake_examples()
    assert recall_accuracy(FakeContender(set()), examples, batch_size) == 1.0
    # wrong: one token of a 5-token answer (the whole answer fails), a 1-token answer, and the last token of
    # example 4; a wrong prediction outside every answer (1, 2) and (2, 11) changes nothing
    wrong = {(1, 10), (2, 3), (4, 8), (1, 2), (2, 11)}
    fake = FakeContender(wrong)
    assert recall_accuracy(fake, examples, batch_size) == pytest.approx(4 / 7)
    assert len(fake.calls) == -(-len(examples) // batch_size)  # one forward per batch
    # every answer wrong in one token
    everything = {(1, 5), (1, 12), (1, 15), (2, 3), (2, 7), (3, 4), (4, 8)}
    assert recall_accuracy(FakeContender(everything), examples, batch_size) == 0.0
    # the token *before* an answer is not part of it: wrong at position p - 1 of each answer counts for nothing
    before = {(1, 4), (1, 7), (1, 14), (2, 2), (2, 5), (3, 3), (4, 7)}
    assert recall_accuracy(FakeContender(before), examples, batch_size) == 1.0


def test_recall_accuracy_of_nothing_is_zero():
    assert recall_accuracy(FakeContender(set()), [RecallExample([1, 2, 3], [])]) == 0.0


# --- with SmolLM2's tokenizer and model (slow) ------------------------------------------------------------------

@pytest.fixture(scope="module")
def fresh_gsa(smollm2):
    return t2r.convert(smollm2[0], "gsa").eval()


@pytest.mark.slow
def test_word_tokens_are_single_token_words(smollm2):
    _, tok = smollm2
    words = word_tokens(tok, 64, seed=0)
    assert len(set(words)) == 64
    for w in words:
        text = tok.decode([w])
        assert text.startswith(" ") and text[1:].isalpha() and text[1:].islower() and 3 <= len(text) - 1 <= 8
        assert tok(text, add_special_tokens=False)["input_ids"] == [w]
    assert word_tokens(tok, 64, seed=0) == words and word_tokens(tok, 64, seed=1) != words


@pytest.mark.slow
@pytest.mark.parametrize("num_pairs", [4, 8])
def test_mqar_examples_layout_and_answers(smollm2, num_pairs):
    _, tok = smollm2
    examples = mqar_examples(tok, num_pairs, count=3, seed=0)
    assert len(examples) == 3
    for example in examples:
        text = tok.decode(example.ids)
        assert text.startswith(MQAR_PREFIX) and text.endswith("\n")
        lines = text[len(MQAR_PREFIX):].split("\n")
        assert len(lines) == 2 * num_pairs + 2 and lines[num_pairs] == "" and lines[-1] == ""
        pairs = [line.split(":") for line in lines[:num_pairs]]
        queries = [line.split(":") for line in lines[num_pairs + 1:-1]]
        words = [w for pair in pairs for w in pair]
        assert all(w.startswith(" ") and w[1:].isalpha() for w in words)
        assert len(set(words)) == 2 * num_pairs  # keys and values all distinct
        table = dict(pairs)
        assert sorted(k for k, _ in queries) == sorted(table)  # every key asked once
        assert all(table[k] == v for k, v in queries)          # with its own value after it
        # answers point at the value token of each query, in query order
        assert len(example.answers) == num_pairs and all(len(a) == 1 for a in example.answers)
        for (key, value), (pos,) in zip(queries, example.answers):
            assert tok.decode([example.ids[pos]]) == value
            assert tok.decode(example.ids[:pos]).endswith("\n" + key + ":")
        assert example.answers[-1][0] == len(example.ids) - 2  # the last value, then the final newline
    same = mqar_examples(tok, num_pairs, count=3, seed=0)
    other = mqar_examples(tok, num_pairs, count=3, seed=1)
    assert [(e.ids, e.answers) for e in same] == [(e.ids, e.answers) for e in examples]
    assert [e.ids for e in other] != [e.ids for e in examples]


@pytest.mark.slow
@pytest.mark.parametrize("depth", [0, 0.25, 0.5, 0.75, 1])
def test_passkey_examples_with_a_bpe_tokenizer(smollm2, depth):
    _, tok = smollm2
    length = 512
    examples = passkey_examples(tok, length, depth, count=3, seed=0)
    prefix = tok.bos_token if tok.bos_token_id is not None and getattr(tok, "add_bos_token", True) else ""
    for example in examples:
        assert abs(len(example.ids) - length) <= 3
        measured = check_passkey_layout(tok, example, depth, prefix=prefix)
        assert abs(measured - depth) <= 0.1, (depth, measured)
    same = passkey_examples(tok, length, depth, count=3, seed=0)
    other = passkey_examples(tok, length, depth, count=3, seed=1)
    assert [e.ids for e in same] == [e.ids for e in examples]
    assert [e.ids for e in other] != [e.ids for e in examples]


@pytest.mark.slow
def test_source_solves_recall_fresh_gsa_does_not(smollm2, fresh_gsa):
    model, tok = smollm2
    source, gsa = Contender("source", model), Contender("gsa", fresh_gsa)
    mqar_result = mqar([source, gsa], tok, pairs=[8], count=4, seed=0, batch_size=4)
    assert mqar_result["pairs"] == [8] and mqar_result["tokens"][0] > 8 * 4
    assert mqar_result["accuracy"]["source"][0] >= 0.6   # measured 0.875
    assert mqar_result["accuracy"]["gsa"][0] <= 0.2      # measured 0.0

    # 256 tokens: what 512 showed (source 1.0, fresh GSA 0.0 at both depths) at a fifth of the time on 2 CPU cores
    passkey_result = passkey([source, gsa], tok, lengths=[256], depths=[0, 0.5], count=4, seed=0, batch_size=4)
    assert passkey_result["lengths"] == [256] and passkey_result["depths"] == [0, 0.5]
    assert len(passkey_result["accuracy"]["source"]) == 1 and len(passkey_result["accuracy"]["source"][0]) == 2
    assert all(acc >= 0.75 for acc in passkey_result["accuracy"]["source"][0])  # measured 1.0, 1.0
    assert all(acc <= 0.2 for acc in passkey_result["accuracy"]["gsa"][0])      # measured 0.0, 0.0


@pytest.mark.slow
def test_short_window_forgets_an_early_passkey(smollm2):
    model, tok = smollm2
    examples = passkey_examples(tok, 256, 0, count=4, seed=0)
    window = Contender("window", model, window=64, sinks=4)
    assert recall_accuracy(window, examples, batch_size=4) == 0.0  # the key is ~200 tokens back (512 tokens: ~450)
    # while the key inside the window is found by the same windowed model
    late = passkey_examples(tok, 256, 1, count=4, seed=0)
    assert recall_accuracy(window, late, batch_size=4) >= 0.75
