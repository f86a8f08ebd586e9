"""Offline text for the tests: a character and a word-level tokenizer, sample sentences, JSON-lines writers.

Both tokenizers keep every token id below 97, the vocabulary of `tests.helpers.models.tiny_source`.
"""

import json
import random
import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIALS = ["<pad>", "<unk>", "</s>"]  # ids 0, 1, 2: tiny_source's pad and eos ids are 0 and 2
CHARS = "\n" + "".join(c for c in string.printable[:95] if c not in "`~^|\\\t\r\x0b\x0c")

SENTENCES = [
    "The river was quiet.",
    "She opened the window and listened to the rain falling on the old tin roof of the shed.",
    "Numbers like 42 and 7 show up too.",
    "A short one.",
    "Before the meeting, the team wrote down three questions they wanted answered, and then argued about the order.",
    "Birds flew south.",
    "He said: \"Bring the map, the lamp, and the bread.\"",
    "Most of the village was asleep when the train finally arrived, two hours late and covered in snow.",
    "Why not?",
    "The recipe asks for flour, water, salt and a lot of patience.",
    "Every morning the baker lit the oven at four.",
    "It rained.",
    "Linear attention keeps a fixed-size state instead of a growing cache of keys and values.",
    "The cat slept on the warm stones by the door all afternoon.",
    "Ships left the harbour one by one (slowly).",
    "Tea or coffee?",
    "Over the years the library grew from a single shelf to three full rooms of books, maps and letters.",
    "The bridge was closed for repairs.",
    "Children ran across the field, shouting; the dog followed them.",
    "Stars came out over the hills.",
]


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character (95 ids: 3 specials, newline and printable ASCII); other characters are <unk>."""
    vocab = {token: i for i, token in enumerate(SPECIALS + list(CHARS))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", pad_token="<pad>", unk_token="<unk>")


def word_tokenizer() -> PreTrainedTokenizerFast:
    """One token per whitespace-separated word "w0" ... "w96" (pad w0, bos w1, eos w2; other words are w3)."""
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(97)}, unk_token="w3"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="w0", bos_token="w1", eos_token="w2")


def write_jsonl(path, rows, opener=open):
    """Rows (dicts) as JSON lines at `path` (`opener=gzip.open` compresses); returns `path`."""
    with opener(path, "wt", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


def text_rows(texts, source: str) -> list[dict]:
    """`{"text": ..., "source": source}` rows."""
    return [{"text": text, "source": source} for text in texts]


def write_words(path, documents: int = 6, words: int = 300):
    """Documents of random words "w4" ... "w96" for `word_tokenizer` (seeded); returns `path`."""
    rng = random.Random(0)
    return write_jsonl(path, [{"text": " ".join(f"w{rng.randrange(4, 97)}" for _ in range(words))}
                              for _ in range(documents)])
