"""`token_rows` (`t2r.data.rows`): held-out documents cut to rows, or packed end to end."""

import json

import pytest
import torch

from t2r.data import DataConfig
from t2r.data.documents import load_documents
from t2r.data.rows import token_rows
from tests.helpers.data import char_tokenizer

# distinct documents of varied lengths; with length 32, the long ones are those of >= 32 characters
DOCS = [
    "alpha short.",
    "bravo: a document long enough to give a whole row of tokens.",
    "charlie is short too",
    "delta runs on and on, well past the thirty-two characters of a row.",
    "echo",
    "foxtrot: exactly a row of chars.",  # 32 characters: exactly one row
    "golf: another long document, with commas, dots and more words.",
    "hotel: 31 characters, one short",
    "india: long again, the last of the long documents in this file.",
    "juliet, short",
]


def write_docs(tmp_path, docs=DOCS):
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    return str(path)


def test_token_rows_keeps_long_documents_cut_to_length(tmp_path):
    tok = char_tokenizer()
    assert len(DOCS[5]) == 32 and len(DOCS[7]) == 31
    held_out = 7
    cfg = DataConfig(path=write_docs(tmp_path), held_out=held_out)
    validation = list(load_documents(cfg, 0, "validation"))
    assert len(validation) == held_out
    long_ones = [d for d in validation if len(d) >= 32]
    assert 0 < len(long_ones) < held_out and DOCS[5] in long_ones and DOCS[7] in validation

    rows = token_rows(cfg, tok, length=32, rows=100, seed=0)
    assert rows.dtype == torch.long and rows.shape == (len(long_ones), 32)
    texts = [tok.decode(r) for r in rows.tolist()]
    assert texts == [d[:32] for d in long_ones]  # held-out order, only documents of >= 32 tokens
    training = set(DOCS) - set(validation)
    assert not any(text == d[:32] for text in texts for d in training)  # never a training document

    two = token_rows(cfg, tok, length=32, rows=2, seed=0)
    assert torch.equal(two, rows[:2])


def test_token_rows_pack_joins_documents_with_eos(tmp_path):
    tok = char_tokenizer()
    eos = tok.eos_token_id
    assert eos == 2
    cfg = DataConfig(path=write_docs(tmp_path), held_out=len(DOCS))
    validation = list(load_documents(cfg, 0, "validation"))
    stream = []
    for d in validation:
        stream += tok(d, add_special_tokens=False)["input_ids"] + [eos]
    length, count = 50, 4
    rows = token_rows(cfg, tok, length=length, rows=count, seed=0, pack=True)
    assert rows.shape == (count, length)
    assert torch.equal(rows, torch.tensor(stream[:length * count]).view(count, length))
    assert (rows == eos).sum() > 0  # documents are separated by EOS
    # all the stream there is: whole rows only, no partial last row
    everything = token_rows(cfg, tok, length=length, rows=10_000, seed=0, pack=True)
    assert everything.shape == (len(stream) // length, length)
    # short documents, which pack=False drops, are in the packed rows
    assert DOCS[4] + tok.eos_token in tok.decode(everything.flatten().tolist(), skip_special_tokens=False)


def test_token_rows_other_seed_other_documents(tmp_path):
    tok = char_tokenizer()
    cfg = DataConfig(path=write_docs(tmp_path), held_out=len(DOCS))
    a = token_rows(cfg, tok, length=32, rows=100, seed=0)
    b = token_rows(cfg, tok, length=32, rows=100, seed=1)
    # held_out covers every document: the same rows, in another (seeded) order
    assert sorted(map(tuple, a.tolist())) == sorted(map(tuple, b.tolist()))
    assert not torch.equal(a, b)


def test_token_rows_too_short_raises(tmp_path):
    tok = char_tokenizer()
    cfg = DataConfig(path=write_docs(tmp_path), held_out=len(DOCS))
    with pytest.raises(ValueError, match="pack=True"):
        token_rows(cfg, tok, length=100, rows=4, seed=0)
    total = sum(len(d) + 1 for d in DOCS)
    assert total // 100 >= 2
    packed = token_rows(cfg, tok, length=100, rows=10, seed=0, pack=True)  # packing rescues it
    assert packed.shape == (total // 100, 100)
    with pytest.raises(ValueError, match="joined together"):
        token_rows(cfg, tok, length=total + 1, rows=1, seed=0, pack=True)
