"""load_documents: every local format, the seeded shuffle, the held-out split, and the error messages."""

import bz2
import shutil

import pytest
from datasets import Dataset

from t2r.data import DataConfig, documents, load_documents


def docs(path, seed=0, part="train", **kw):
    return list(load_documents(DataConfig(path=str(path), **kw), seed=seed, part=part))


@pytest.mark.parametrize("kind", ["jsonl", "jsonl_gz", "json_dir", "parquet", "txt_dir"])
@pytest.mark.parametrize("streaming", [False, True])
def test_each_format_loads_every_document(text_files, kind, streaming):
    path = getattr(text_files, kind)
    loaded = docs(path, streaming=streaming)
    assert sorted(loaded) == sorted(text_files.texts[str(path)])
    assert len(loaded) == len(set(loaded))


def test_txt_file_is_one_document_with_its_newlines(text_files):
    a, b = text_files.texts[str(text_files.txt_dir)]
    assert docs(text_files.txt_dir / "a.txt") == [a]
    assert "\n" in a and a.count("\n") == 3


def test_glob_and_bz2(text_files):
    assert sorted(docs(text_files.root / "json" / "*.jsonl*")) == sorted(text_files.texts[str(text_files.json_dir)])
    packed = text_files.root / "more.jsonl.bz2"
    with open(text_files.jsonl, "rb") as src, bz2.open(packed, "wb") as dst:
        shutil.copyfileobj(src, dst)
    assert sorted(docs(packed)) == sorted(text_files.texts[str(text_files.jsonl)])


@pytest.mark.parametrize("streaming", [False, True])
def test_same_seed_same_order_other_seed_other_order(text_files, streaming):
    first = docs(text_files.json_dir, seed=3, streaming=streaming, shuffle_buffer=100)
    assert first == docs(text_files.json_dir, seed=3, streaming=streaming, shuffle_buffer=100)
    assert first != docs(text_files.json_dir, seed=4, streaming=streaming, shuffle_buffer=100)
    assert first != text_files.texts[str(text_files.json_dir)]  # actually shuffled
    assert sorted(first) == sorted(text_files.texts[str(text_files.json_dir)])


@pytest.mark.parametrize("streaming", [False, True])
def test_held_out_and_train_are_disjoint_and_complete(text_files, streaming):
    kw = dict(seed=1, held_out=5, streaming=streaming)
    validation = docs(text_files.json_dir, part="validation", **kw)
    train = docs(text_files.json_dir, part="train", **kw)
    assert len(validation) == 5 and len(train) == 14 - 5
    assert not set(validation) & set(train)
    assert validation + train == docs(text_files.json_dir, seed=1, streaming=streaming)  # the shuffled stream, split
    assert validation == docs(text_files.json_dir, part="validation", **kw)


def test_no_held_out_gives_empty_validation(text_files):
    assert docs(text_files.jsonl, part="validation") == []


def test_max_documents_caps_training_documents_only(text_files):
    train = docs(text_files.json_dir, held_out=3, max_documents=4)
    assert train == docs(text_files.json_dir, held_out=3)[:4]
    assert len(docs(text_files.json_dir, held_out=3, max_documents=4, part="validation")) == 3
    assert len(docs(text_files.json_dir, max_documents=100)) == 14


def test_empty_documents_are_skipped(text_files):
    loaded = docs(text_files.jsonl)
    assert "" not in loaded and len(loaded) == 8  # the file has 9 rows, one empty


def test_other_text_field(text_files):
    assert sorted(set(docs(text_files.json_dir, text_field="source"))) == ["gz", "jsonl"]


@pytest.mark.parametrize("streaming", [False, True])
def test_wrong_text_field_names_the_columns(text_files, streaming):
    with pytest.raises(ValueError, match="text_field 'content'") as err:
        docs(text_files.jsonl, text_field="content", streaming=streaming)
    assert "'text'" in str(err.value) and "'source'" in str(err.value) and "available columns" in str(err.value)


@pytest.mark.parametrize("missing", ["data/missing.jsonl", "./nowhere", "/no/such/dir", "corpus.txt.gz"])
def test_missing_local_path_is_file_not_found(tmp_path, monkeypatch, missing):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="not found: ") as err:
        docs(missing)
    assert f"not found: {missing} (no such file or directory" in str(err.value)


def test_glob_matching_nothing(text_files):
    with pytest.raises(FileNotFoundError, match="no files match"):
        docs(text_files.root / "*.nothing")


def test_directory_without_supported_files(tmp_path):
    (tmp_path / "notes.csv").write_text("a,b\n1,2\n")
    (tmp_path / ".hidden.jsonl").write_text('{"text": "hidden"}\n')
    with pytest.raises(ValueError, match="no supported data files") as err:
        docs(tmp_path)
    assert ".jsonl" in str(err.value) and ".parquet" in str(err.value)


def test_directory_mixing_formats(text_files):
    with pytest.raises(ValueError, match="mixes file formats"):
        docs(text_files.root)


def test_unsupported_files(text_files):
    csv = text_files.root / "table.csv"
    csv.write_text("text\nhello\n")
    with pytest.raises(ValueError, match="unsupported data file"):
        docs(csv)
    gz = text_files.root / "shard.parquet.gz"
    gz.write_bytes(b"")
    with pytest.raises(ValueError, match="decompress"):
        docs(gz)


def test_unknown_part(text_files):
    with pytest.raises(ValueError, match="unknown part 'test'"):
        docs(text_files.jsonl, part="test")


def test_hub_id_goes_to_load_dataset_streaming(monkeypatch):
    calls = []

    def fake_load_dataset(path, name=None, **kw):
        calls.append((path, name, kw))
        data = Dataset.from_dict({"text": [f"doc {i}" for i in range(6)], "meta": list(range(6))})
        return data.to_iterable_dataset(num_shards=2) if kw["streaming"] else data

    monkeypatch.setattr(documents, "load_dataset", fake_load_dataset)
    cfg = DataConfig(path="someone/corpus", name="en", split="train", held_out=2)
    train = list(load_documents(cfg, seed=0))
    assert calls[-1] == ("someone/corpus", "en", {"split": "train", "streaming": True})
    assert sorted(train + list(load_documents(cfg, seed=0, part="validation"))) == [f"doc {i}" for i in range(6)]
    cfg.streaming = False
    assert len(list(load_documents(cfg, seed=0))) == 4 and calls[-1][2]["streaming"] is False


def test_a_bad_row_deep_in_a_file_names_the_file_and_line(tmp_path):
    """Past the first 100 documents `check_files` reads: before, `TypeError: text_field 'text' holds int, not str`
    with a traceback and no file or line."""
    from t2r.data.files import DataError
    from tests.helpers.data import write_jsonl

    path = write_jsonl(tmp_path / "deep.jsonl", [{"text": f"document {i}"} for i in range(300)] + [{"text": 5}])
    with pytest.raises(DataError, match=r"deep.jsonl, line 301: field 'text' holds int, not text: fix or delete the "
                                        r"line, or set data.text_field to a field of strings"):
        docs(path)


def test_a_file_rewritten_with_its_size_and_mtime_kept_is_read_anew(tmp_path, monkeypatch):
    """`datasets` caches a local file's parse by path, size and mtime; `cp -p`, `touch -r` or rsync keep the last
    two, and the old documents came back. The cache is keyed on the content now."""
    import os

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"text": "first version"}\n{"text": "second line A"}\n')
    stat = path.stat()
    before = list(load_documents(DataConfig(path=str(path)), seed=0))
    path.write_text('{"text": "first VERSION"}\n{"text": "second line B"}\n')  # same size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
    after = list(load_documents(DataConfig(path=str(path)), seed=0))
    assert sorted(before) == ["first version", "second line A"]
    assert sorted(after) == ["first VERSION", "second line B"]
