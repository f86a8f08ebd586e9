"""Offline fixtures for the data tests: a character tokenizer and small local datasets in every format.

`char_tokenizer` is a plain function (other test packages import it) and keeps every token id below 97,
the vocabulary of `tests.models.conftest.tiny_source`.
"""

import gzip
import json
import string
from types import SimpleNamespace

import datasets
import pandas as pd
import pytest
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


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path_factory, monkeypatch):
    """Keep `datasets`' Arrow cache out of the user's home directory."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path_factory.getbasetemp() / "hf_datasets"))


def _rows(texts, source):
    return [{"text": text, "source": source} for text in texts]


def _write_jsonl(path, rows, opener=open):
    with opener(path, "wt", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


@pytest.fixture
def text_files(tmp_path):
    """Small local datasets; each attribute is a path, `texts[path]` the documents it holds (file order).

    - `jsonl`: 8 documents plus one empty one (skipped by the loader)
    - `jsonl_gz`: 6 documents, gzip-compressed JSON lines
    - `json_dir`: the directory holding just those two files (14 documents)
    - `parquet`: 6 documents
    - `txt_dir`: two .txt files, each one multi-line document
    """
    json_dir, txt_dir = tmp_path / "json", tmp_path / "txt"
    json_dir.mkdir()
    txt_dir.mkdir()
    jsonl, jsonl_gz = json_dir / "train-00.jsonl", json_dir / "train-01.jsonl.gz"
    parquet = tmp_path / "shard.parquet"
    _write_jsonl(jsonl, _rows(SENTENCES[:4], "jsonl") + _rows([""], "jsonl") + _rows(SENTENCES[4:8], "jsonl"))
    _write_jsonl(jsonl_gz, _rows(SENTENCES[8:14], "gz"), opener=gzip.open)
    pd.DataFrame(_rows(SENTENCES[14:20], "parquet")).to_parquet(parquet)
    txt_docs = ["\n".join(SENTENCES[0:3]) + "\n", "\n".join(SENTENCES[10:12])]
    for name, text in zip(("a.txt", "b.txt"), txt_docs):
        (txt_dir / name).write_text(text, encoding="utf-8")
    texts = {
        jsonl: SENTENCES[:8], jsonl_gz: SENTENCES[8:14], json_dir: SENTENCES[:14],
        parquet: SENTENCES[14:20], txt_dir: txt_docs,
    }
    return SimpleNamespace(
        root=tmp_path, jsonl=jsonl, jsonl_gz=jsonl_gz, json_dir=json_dir, parquet=parquet, txt_dir=txt_dir,
        texts={str(k): v for k, v in texts.items()},
    )
