"""Data checks before any model loads: every broken file is named with its line and the fix, whether the
check reads it first (`check_files`) or `datasets` trips over it later (`explain`)."""

import gzip
import json
import random

import pandas as pd
import pytest

from t2r.data import DataConfig, load_documents
from t2r.data.check import DataError, check_files, check_rows, check_skipped
from tests.helpers.data import char_tokenizer

GOOD = '{"text": "a fine document"}\n'


def write(path, data: bytes | str):
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


@pytest.mark.parametrize("name, content, message", [
    ("empty.jsonl", b"", "empty.jsonl is empty: delete it or fill it"),
    ("blank.jsonl", b"\n  \n\n", "holds no documents (every file is empty or blank)"),
    ("bad.jsonl", GOOD + '{"text": broken}\n', "bad.jsonl, line 2: not valid JSON (Expecting value, column 10)"),
    ("utf8.jsonl", GOOD + '{"text": "caf\xe9"}\n', None),
    ("latin1.jsonl", GOOD.encode() + '{"text": "caf\xe9"}\n'.encode("latin-1"),
     "latin1.jsonl, line 2: not UTF-8 text (byte 0xe9 at column 14); convert the file to UTF-8"),
    ("list.jsonl", GOOD + "[1, 2]\n", "list.jsonl, line 2: a JSON list where an object is expected"),
    ("number.jsonl", GOOD + '{"text": 7}\n', "number.jsonl, line 2: field 'text' holds int, not text"),
    ("field.jsonl", '{"body": "x"}\n{"body": "y"}\n', "no line has the field 'text' (fields: 'body')"),
    ("latin1.txt", "line one\nline two \xe9\n".encode("latin-1"),
     "latin1.txt, line 2: not UTF-8 text (byte 0xe9 at column 10)"),
])
def test_each_broken_file_is_named_with_its_line(tmp_path, name, content, message):
    path = write(tmp_path / name, content)
    if message is None:  # valid UTF-8 (the é was encoded as UTF-8): no error
        assert check_files(DataConfig(path=str(path))) == 2
        return
    with pytest.raises(DataError) as info:
        check_files(DataConfig(path=str(path)))
    assert message in str(info.value)


def test_a_broken_file_among_good_ones_and_compressed_and_parquet(tmp_path):
    write(tmp_path / "a.jsonl", GOOD * 3)
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as fh:
        fh.write(GOOD + "not json\n")
    with pytest.raises(DataError, match=r"b.jsonl.gz, line 2: not valid JSON"):
        check_files(DataConfig(path=str(tmp_path)))
    pd.DataFrame({"body": ["x"]}).to_parquet(tmp_path / "p.parquet")
    with pytest.raises(DataError, match=r"p.parquet: no column 'text' \(columns: 'body'\)"):
        check_files(DataConfig(path=str(tmp_path / "p.parquet")))
    pd.DataFrame({"text": ["x", "y", " "]}).to_parquet(tmp_path / "q.parquet")
    assert check_files(DataConfig(path=str(tmp_path / "q.parquet"))) == 2


def test_held_out_taking_every_document_and_hub_ids(tmp_path):
    path = write(tmp_path / "d.jsonl", GOOD * 4)
    assert check_files(DataConfig(path=str(path), held_out=3)) == 4
    with pytest.raises(DataError, match="data.held_out: 4 documents held out, but .* holds only 4"):
        check_files(DataConfig(path=str(path), held_out=4))
    assert check_files(DataConfig(path="org/some-dataset")) is None  # hub ids are checked when streamed


def test_only_the_first_documents_are_read_and_datasets_errors_are_explained(tmp_path):
    """A bad line past the sample passes `check_files` but not `datasets`; the error then names it."""
    path = write(tmp_path / "late.jsonl", GOOD * 150 + "{oops\n")
    cfg = DataConfig(path=str(path))
    assert check_files(cfg) is None  # 100 documents read, not the whole file
    with pytest.raises(DataError, match=r"late.jsonl, line 151: not valid JSON"):
        list(load_documents(cfg, 0))
    latin = write(tmp_path / "latin.jsonl", GOOD.encode() * 150 + '{"text": "\xe9"}\n'.encode("latin-1"))
    with pytest.raises(DataError, match=r"latin.jsonl, line 151: not UTF-8 text"):
        list(load_documents(DataConfig(path=str(latin)), 0))
    (tmp_path / "empty").mkdir()
    empty = write(tmp_path / "empty" / "e.jsonl", b"")
    with pytest.raises(DataError, match="e.jsonl is empty"):
        list(load_documents(DataConfig(path=str(empty)), 0))


def test_check_rows_needs_one_packed_row_per_part(tmp_path):
    rows = [{"text": "short"}] * 3 + [{"text": "a much longer document " * 4}] * 10
    path = write(tmp_path / "d.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    tok = char_tokenizer()
    check_rows(DataConfig(path=str(path)), tok, seq_len=32, seed=0)
    cfg = DataConfig(path=str(path), held_out=1)
    docs = list(load_documents(cfg, 0, "validation"))
    seq_len = len(docs[0]) + 2  # the held-out document (+ EOS) is one token short of a row
    with pytest.raises(DataError, match=rf"data.held_out: the 1 held-out documents hold {len(docs[0]) + 1} tokens, "
                                        rf"less than one row of data.seq_len={seq_len}"):
        check_rows(cfg, tok, seq_len=seq_len, seed=0)
    with pytest.raises(DataError, match="data: the training documents .* less than one row of data.seq_len=100000"):
        check_rows(DataConfig(path=str(path)), tok, seq_len=100_000, seed=0)


def test_a_cut_off_compressed_file_is_named_in_one_line(tmp_path):
    """Before: EOFError ("Compressed file ended before the end-of-stream marker was reached") with a traceback."""
    whole = gzip.compress((GOOD * 20).encode())
    cut = write(tmp_path / "cut.jsonl.gz", whole[:len(whole) // 2])
    with pytest.raises(DataError, match=r"cut.jsonl.gz: the compressed file is cut off or damaged \(Compressed file "
                                        r"ended before the end-of-stream marker was reached\); download or compress"):
        check_files(DataConfig(path=str(cut)))
    (tmp_path / "late").mkdir()
    rows = "".join(json.dumps({"text": f"document {i} {random.Random(i).getrandbits(128):x}"}) + "\n"
                   for i in range(5000))  # incompressible enough that the cut is past the first documents
    late = write(tmp_path / "late" / "late.jsonl.gz", gzip.compress(rows.encode())[:-40])
    assert check_files(DataConfig(path=str(late))) is None  # the first documents read fine
    with pytest.raises(DataError, match=r"late.jsonl.gz: the compressed file is cut off or damaged"):
        list(load_documents(DataConfig(path=str(late)), 0))


@pytest.mark.parametrize("bad, where", [
    ('{"id": 7}', "line 2501"),           # no text field
    ('{"text": null}', "line 2501"),      # null
    ('{"text": "  "}', "line 2501"),      # blank
])
def test_rows_without_text_deep_in_a_file_are_counted_named_and_refused_above_the_fraction(tmp_path, bad, where):
    """Before: skipped without a word, in --dry-run and in the run (the file checks read only the first rows)."""
    lines = [json.dumps({"text": f"document {i}", "id": i}) for i in range(3000)]
    lines[2500] = bad
    path = write(tmp_path / "d.jsonl", "\n".join(lines) + "\n")
    note = check_skipped(DataConfig(path=str(path)))
    assert note == (f"data: 1 of 3,000 rows (0.03%) have no text in 'text' (missing, null or blank; the first: "
                    f"{path}, {where}): skipped")
    for i in range(1000, 1100):
        lines[i] = bad
    write(path, "\n".join(lines) + "\n")
    with pytest.raises(DataError, match=rf"data: 101 of 3,000 rows \(3.37%\) .* the first: {path}, line 1001\), more "
                                        r"than data.max_skipped=0.01: fix or delete those rows"):
        check_skipped(DataConfig(path=str(path)))
    assert "101 of 3,000 rows" in check_skipped(DataConfig(path=str(path), max_skipped=0.05))


def test_rows_without_text_in_parquet_and_text_files_and_none_at_all(tmp_path):
    pd.DataFrame({"text": ["a", None, "b", "c"]}).to_parquet(tmp_path / "d.parquet")
    with pytest.raises(DataError, match=r"1 of 4 rows \(25.00%\) .* the first: .*d.parquet, row 2\)"):
        check_skipped(DataConfig(path=str(tmp_path / "d.parquet")))
    (tmp_path / "txt").mkdir()
    write(tmp_path / "txt" / "a.txt", "one document")
    write(tmp_path / "txt" / "b.txt", "\n \n")
    with pytest.raises(DataError, match=r"1 of 2 rows .* the first: .*b.txt \(blank\)\)"):
        check_skipped(DataConfig(path=str(tmp_path / "txt")))
    assert check_skipped(DataConfig(path=str(write(tmp_path / "ok.jsonl", GOOD * 3)))) is None
    assert check_skipped(DataConfig(path="owner/dataset")) is None  # a hub dataset: not read ahead
