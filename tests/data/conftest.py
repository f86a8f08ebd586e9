"""Small local datasets in every format the data loader reads."""

import gzip
from types import SimpleNamespace

import pandas as pd
import pytest

from tests.helpers.data import SENTENCES, text_rows, write_jsonl


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
    write_jsonl(jsonl, text_rows(SENTENCES[:4] + [""] + SENTENCES[4:8], "jsonl"))
    write_jsonl(jsonl_gz, text_rows(SENTENCES[8:14], "gz"), opener=gzip.open)
    pd.DataFrame(text_rows(SENTENCES[14:20], "parquet")).to_parquet(parquet)
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
