"""Local data files: which files a `DataConfig` path names and in which format (`local_files`), and a plain-Python
read of each (`check_files`) whose errors name the file, the line and the fix.

`check_files` reads the first documents of every file (JSON lines, UTF-8 text, Parquet schema), so an empty file,
a broken JSON line, bytes that are not UTF-8, a missing or non-text field, or a source with no document at all is
reported as `DataError` instead of a `datasets` traceback; `explain` turns a failure inside `datasets` into the
same kind of message, scanning the files in full to find the line.
"""

from __future__ import annotations

import bz2
import codecs
import glob
import gzip
import itertools
import json
import lzma
import os
import zlib
from pathlib import Path

from t2r.paths import is_local

from .config import DataConfig

BUILDERS = {".jsonl": "json", ".json": "json", ".txt": "text", ".parquet": "parquet"}
"""File suffix -> `datasets` builder. json and text files may also be compressed (see COMPRESSIONS)."""
COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")  # decompressed by datasets on the fly (.zst needs `zstandard`)
_SUPPORTED = ".txt, .jsonl, .json (each optionally .gz/.bz2/.xz/.zst) and .parquet"
SAMPLE_DOCUMENTS = 100  # documents read from the start of each file by check_files
TEXT_BYTES = 1 << 20  # bytes read from the start of each .txt file (one document each)


def local_files(path: str) -> tuple[str, list[str]]:
    """(builder, sorted files) for a file, a directory (all supported files below it) or a glob."""
    if os.path.isfile(path):
        builder = _builder(path)
        if builder is None:
            raise ValueError(f"unsupported data file {path!r}: {_supported_hint(path)}")
        return builder, [path]
    if os.path.isdir(path):
        candidates = [str(p) for p in sorted(Path(path).rglob("*")) if p.is_file() and not _hidden(p, path)]
        where = f"directory {path!r}"
    else:
        candidates = sorted(p for p in glob.glob(path, recursive=True) if os.path.isfile(p))
        if not candidates:
            raise FileNotFoundError(f"no files match the glob {path!r}: check the pattern")
        where = f"glob {path!r}"
    files = [f for f in candidates if _builder(f) is not None]
    if not files:
        raise ValueError(f"no supported data files in {where}: expected {_SUPPORTED}")
    builders = sorted({_builder(f) for f in files})
    if len(builders) > 1:
        raise ValueError(
            f"{where} mixes file formats ({', '.join(builders)}): point `path` at one kind, "
            f"e.g. with a glob such as 'dir/*.jsonl'"
        )
    return builders[0], files


def files_read(cfg: DataConfig, shown: int = 5) -> str | None:
    """One line naming the files a directory or glob `cfg.path` gives (and those beside them that are not read, not
    being data files), so a file added or left out is seen; None for one file or a hub dataset."""
    path = os.path.expanduser(cfg.path)
    if not is_local(path) or os.path.isfile(path):
        return None
    _, files = local_files(path)
    root = path if os.path.isdir(path) else _glob_root(path)
    names = [os.path.relpath(f, root) for f in files]
    line = f"data: {len(files):,} file{'s' if len(files) != 1 else ''} read from {cfg.path}: {_listed(names, shown)}"
    if os.path.isdir(path):
        others = [os.path.relpath(p, path) for p in sorted(Path(path).rglob("*"))
                  if p.is_file() and not _hidden(p, path) and _builder(str(p)) is None]
        if others:
            line += f" (not read, not data files: {_listed(others, shown)})"
    return line


def _glob_root(pattern: str) -> str:
    """The directory a glob starts in: its parts before the first with a wildcard."""
    parts = list(itertools.takewhile(lambda part: not glob.has_magic(part), Path(pattern).parts[:-1]))
    return os.path.join(*parts) if parts else "."


def _listed(names: list[str], shown: int) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown:,} more" if len(names) > shown else "")


def _builder(path: str) -> str | None:
    name = os.path.basename(path).lower()
    for compression in ("", *COMPRESSIONS):
        for suffix, builder in BUILDERS.items():
            if name.endswith(suffix + compression) and not (builder == "parquet" and compression):
                return builder
    return None


def _supported_hint(path: str) -> str:
    if path.lower().endswith(tuple(".parquet" + c for c in COMPRESSIONS)):
        return "parquet is compressed internally and cannot be read compressed again: decompress the file"
    return f"supported are {_SUPPORTED}"


def _hidden(file: Path, root: str) -> bool:
    return any(part.startswith(".") for part in file.relative_to(root).parts)


class DataError(ValueError):
    """Training data that cannot be used; the message names the file (and line) and the fix."""


def check_files(cfg: DataConfig, limit: int | None = SAMPLE_DOCUMENTS) -> int | None:
    """Read the first `limit` documents of every local file of `cfg` (all of them when None). Returns the
    number of documents when every file was read to its end, else None; hub ids are not checked (None)."""
    path = os.path.expanduser(cfg.path)
    if not is_local(path):
        return None
    builder, files = local_files(path)
    total, complete = 0, True
    for file in files:
        count, whole = _checked(CHECKS[builder], Path(file), cfg.text_field, limit)
        total += count
        complete = complete and whole
    if complete and total == 0:
        raise DataError(f"data.path: {cfg.path!r} holds no documents (every file is empty or blank): point "
                        "data.path at files with text")
    if complete and total <= cfg.held_out:
        raise DataError(f"data.held_out: {cfg.held_out} documents held out, but {cfg.path!r} holds only {total}, "
                        "leaving none to train on: lower data.held_out")
    return total if complete else None


def _checked(check, path: Path, field: str, limit: int | None) -> tuple[int, bool]:
    """`check(path, field, limit)`, with a compressed file that is cut off or damaged named in one line."""
    try:
        return check(path, field, limit)
    except (EOFError, zlib.error, lzma.LZMAError, OSError) as err:
        if isinstance(err, DataError) or not path.name.lower().endswith(COMPRESSIONS):
            raise
        raise DataError(f"{path}: the compressed file is cut off or damaged ({err}); download or compress it "
                        "again, or move it out of data.path") from None


def explain(cfg: DataConfig, err: Exception) -> Exception:
    """A DataError naming the file and line behind `err`, raised by `datasets` while reading `cfg`."""
    try:
        check_files(cfg, limit=None)
    except DataError as found:
        return found
    except Exception:  # noqa: BLE001 - the original error is reported below
        pass
    message = str(err.__cause__ or err).strip()
    cause = message.splitlines()[-1] if message else type(err).__name__
    return DataError(f"data.path: reading {cfg.path!r} failed: {cause}")


def _open(path: Path):
    name = path.name.lower()
    if name.endswith(".gz"):
        return gzip.open(path, "rb")
    if name.endswith(".bz2"):
        return bz2.open(path, "rb")
    if name.endswith(".xz"):
        return lzma.open(path, "rb")
    if name.endswith(".zst"):
        import zstandard  # datasets needs it for .zst too

        return zstandard.open(path, "rb")
    return open(path, "rb")


def _utf8(raw: bytes, path: Path, line: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{path}, line {line}: not UTF-8 text (byte 0x{raw[err.start]:02x} at column {err.start + 1}); "
                        "convert the file to UTF-8, e.g. `iconv -f latin1 -t utf-8`") from None


def _text_of(row, path: Path, line: int, field: str) -> str | None:
    if not isinstance(row, dict):
        raise DataError(f"{path}, line {line}: a JSON {type(row).__name__} where an object is expected; each line "
                        f"must be one object such as {{\"{field}\": \"...\"}}")
    if field not in row:
        return None
    text = row[field]
    if text is not None and not isinstance(text, str):
        raise DataError(f"{path}, line {line}: field {field!r} holds {type(text).__name__}, not text: fix or delete "
                        "the line, or set data.text_field to a field of strings")
    return text


def _json(path: Path, field: str, limit: int | None) -> tuple[int, bool]:
    if path.stat().st_size == 0:
        raise DataError(f"{path} is empty: delete it or fill it (every supported file under data.path is read)")
    count, fields_seen, with_field = 0, set(), 0
    with _open(path) as fh:
        head = fh.read(1 << 16)
        if head.lstrip()[:1] == b"[":  # one JSON array, not JSON lines
            data = _utf8(head + fh.read(), path, 1)
            try:
                rows = json.loads(data)
            except json.JSONDecodeError as err:
                raise DataError(f"{path}, line {err.lineno}: not valid JSON ({err.msg}, column {err.colno}); fix the "
                                "file") from None
            texts = [_text_of(row, path, 1, field) for row in rows]
            return sum(1 for t in texts if t and t.strip()), True
        lines = _lines(head, fh)
        for number, raw in enumerate(lines, 1):
            text = _utf8(raw, path, number)
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as err:
                raise DataError(f"{path}, line {number}: not valid JSON ({err.msg}, column {err.colno}); each line "
                                f"must be one JSON object such as {{\"{field}\": \"...\"}}: fix or delete the line"
                                ) from None
            value = _text_of(row, path, number, field)
            fields_seen.update(row)
            with_field += field in row
            count += bool(value and value.strip())
            if limit is not None and count >= limit:
                return count, False
    if fields_seen and not with_field:
        seen = ", ".join(map(repr, sorted(fields_seen)))
        raise DataError(f"{path}: no line has the field {field!r} (fields: {seen}); "
                        "set data.text_field to the field holding the text")
    return count, True


def _lines(head: bytes, fh):
    """The lines (bytes) of a stream whose first `head` bytes were already read."""
    rest = b""
    for chunk in itertools.chain((head,), iter(lambda: fh.read(1 << 20), b"")):  # lazily: only what is read
        parts = (rest + chunk).split(b"\n")
        rest = parts.pop()
        yield from parts
    if rest:
        yield rest


def _text(path: Path, field: str, limit: int | None) -> tuple[int, bool]:
    """A .txt file is one document (datasets' text builder, sample_by="document")."""
    with _open(path) as fh:
        data = fh.read() if limit is None else fh.read(TEXT_BYTES)
        whole = limit is None or not fh.read(1)
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        text = decoder.decode(data, final=whole)
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b"\n") + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise DataError(f"{path}, line {line}: not UTF-8 text (byte 0x{data[err.start]:02x} at column {column}); "
                        "convert the file to UTF-8, e.g. `iconv -f latin1 -t utf-8`") from None
    return int(bool(text.strip())), whole or bool(text.strip())


def _parquet(path: Path, field: str, limit: int | None) -> tuple[int, bool]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as err:
        raise DataError(f"{path}: not a readable Parquet file ({err}); rewrite it or remove it") from None
    schema = table.schema_arrow
    if field not in schema.names:
        raise DataError(f"{path}: no column {field!r} (columns: {', '.join(map(repr, schema.names))}); set "
                        "data.text_field to the column holding the text")
    kind = schema.field(field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise DataError(f"{path}: column {field!r} holds {kind}, not text; set data.text_field to a string column")
    count, read = 0, 0
    for batch in table.iter_batches(columns=[field], batch_size=1024):
        for value in batch.column(0).to_pylist():
            read += 1
            count += bool(value and value.strip())
        if limit is not None and count >= limit:
            break
    return count, read == table.metadata.num_rows


CHECKS = {"json": _json, "text": _text, "parquet": _parquet}


def first_without_text(cfg: DataConfig) -> str:
    """Where the first row of `cfg`'s local files without text (its field missing, null or blank) is: "file, line
    N" (a row of a JSON array or Parquet file by its number, a blank .txt file by its name)."""
    builder, files = local_files(os.path.expanduser(cfg.path))
    for file in map(Path, files):
        for where, text in _rows(builder, file, cfg.text_field):
            if text is None or (isinstance(text, str) and not text.strip()):
                return where
    return cfg.path


def _rows(builder: str, file: Path, field: str):
    """(where, text) of each row of a file `datasets` read whole (so every row is valid)."""
    if builder == "parquet":
        import pyarrow.parquet as pq

        batches = pq.ParquetFile(file).iter_batches(columns=[field])
        for number, text in enumerate((t for batch in batches for t in batch.column(0).to_pylist()), 1):
            yield f"{file}, row {number}", text
        return
    with _open(file) as fh:
        if builder == "text":
            yield f"{file} (blank)", fh.read().decode("utf-8", errors="replace")
            return
        head = fh.read(1 << 16)
        if head.lstrip()[:1] == b"[":  # one JSON array
            for number, row in enumerate(json.loads(head + fh.read()), 1):
                yield f"{file}, row {number}", row.get(field)
            return
        for number, raw in enumerate(_lines(head, fh), 1):
            if raw.strip():
                yield f"{file}, line {number}", json.loads(raw).get(field)
