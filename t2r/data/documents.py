"""Documents from a `DataConfig`: local files or a hub dataset, read through `datasets`, shuffled by seed.

The shuffled stream is split by position: the first `held_out` documents are the validation part and
the rest the training part, so the two never overlap and the same seed always gives the same split.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from itertools import islice
from typing import TYPE_CHECKING

from t2r.paths import is_local  # the one local-path vs hub-id rule (re-exported here)

from .config import DataConfig
from .files import explain, local_files

if TYPE_CHECKING:
    from datasets import Dataset, IterableDataset

PARTS = ("train", "validation")


def load_documents(cfg: DataConfig, seed: int, part: str = "train") -> Iterator[str]:
    """The documents (strings) of one part of `cfg`'s source, in an order fixed by `seed`.

    `part="validation"` yields the first `cfg.held_out` shuffled documents, `part="train"` the rest,
    at most `cfg.max_documents` of them. Empty (or whitespace-only) documents are skipped before the
    split, so `held_out` counts real documents. Local files are read eagerly (`streaming=False`)
    unless `cfg.streaming` says otherwise; hub ids stream by default.
    """
    if part not in PARTS:
        raise ValueError(f"unknown part {part!r}: use 'train' or 'validation'")
    if cfg.held_out < 0:
        raise ValueError(f"held_out must be >= 0, got {cfg.held_out}")
    if cfg.max_documents is not None and cfg.max_documents < 0:
        raise ValueError(f"max_documents must be >= 0 or None, got {cfg.max_documents}")
    dataset = open_dataset(cfg)
    dataset = shuffled(dataset, seed, cfg.shuffle_buffer)
    documents = _texts(dataset, cfg)
    if part == "validation":
        return islice(documents, cfg.held_out)
    stop = None if cfg.max_documents is None else cfg.held_out + cfg.max_documents
    return islice(documents, cfg.held_out, stop)


def open_dataset(cfg: DataConfig) -> Dataset | IterableDataset:
    """The unshuffled `datasets` object for `cfg.path` (local files or a hub id), column checked."""
    path = os.path.expanduser(cfg.path)
    if is_local(path):
        builder, files = local_files(path)
        kwargs = {"sample_by": "document"} if builder == "text" else {}
        streaming = bool(cfg.streaming)
        if not streaming:  # datasets caches a local file's parse under its path, size and mtime: a file rewritten
            kwargs["name"] = content_key(cfg)  # with its mtime kept would read as the old one; key it on content
        try:
            dataset = load_dataset(builder, data_files={"train": files}, split="train", streaming=streaming, **kwargs)
        except (ImportError, FileNotFoundError):
            raise
        except Exception as err:  # a datasets traceback: find the file and line, say what to fix
            raise explain(cfg, err) from None
    else:
        streaming = True if cfg.streaming is None else cfg.streaming
        dataset = load_dataset(cfg.path, cfg.name, split=cfg.split, streaming=streaming)
    columns = dataset.column_names  # None for some streamed hub datasets: then checked on the first row
    if columns is not None and cfg.text_field not in columns:
        raise ValueError(_missing_field(cfg, columns))
    return dataset


def rows_without_text(cfg: DataConfig) -> tuple[int, int] | None:
    """(rows whose `text_field` is missing, null or blank, all rows) of `cfg`'s local files as `datasets` reads
    them (the training stream skips those rows); None for a hub dataset or streamed files (not read ahead).

    A row the stream cannot skip, whose field holds a number, list or object (`datasets` then reads the column as
    JSON values), or bytes that are not UTF-8, is refused here, naming its file and line: the stream would stop
    there, mid-training, wherever the shuffle put it (before, only when it got there; `--dry-run` passed)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not is_local(os.path.expanduser(cfg.path)) or cfg.streaming:
        return None
    column = open_dataset(cfg).data.column(cfg.text_field)
    if not pa.types.is_string(column.type) and not pa.types.is_large_string(column.type):
        raise explain(cfg, TypeError(f"field {cfg.text_field!r} holds values that are not text"))
    try:
        column.validate(full=True)  # every string valid UTF-8
    except pa.ArrowInvalid as err:
        raise explain(cfg, err) from None
    blank = pc.sum(pc.equal(pc.utf8_trim_whitespace(column), "")).as_py() or 0
    return column.null_count + blank, len(column)


def content_key(cfg: DataConfig) -> str:
    """A name for `datasets`' cache of `cfg`'s local files that changes with their content (their fingerprints,
    `t2r.data.fingerprint`: SHA-256 of each file, sampled above 1 GiB)."""
    import hashlib
    import json

    from .fingerprint import fingerprint

    return "t2r-" + hashlib.sha256(json.dumps(fingerprint(cfg), sort_keys=True).encode()).hexdigest()[:20]


def load_dataset(*args, **kwargs):
    """`datasets.load_dataset`, imported on first use: `datasets` is an optional dependency (`t2r[train]`)."""
    try:
        from datasets import load_dataset as load
    except ImportError as err:
        raise ImportError("reading training data needs the `datasets` package: pip install 't2r[train]'") from err
    return load(*args, **kwargs)


def shuffled(dataset: Dataset | IterableDataset, seed: int, buffer_size: int) -> Dataset | IterableDataset:
    """Seeded shuffle: exact for in-memory datasets, shard order + a `buffer_size` buffer when streaming."""
    from datasets import IterableDataset

    if isinstance(dataset, IterableDataset):
        return dataset.shuffle(seed=seed, buffer_size=buffer_size)
    return dataset.shuffle(seed=seed, keep_in_memory=True)  # indices in memory: no cache file per seed


def _texts(dataset: Dataset | IterableDataset, cfg: DataConfig) -> Iterator[str]:
    """The `text_field` of each row, skipping empty documents."""
    if dataset.column_names is not None:
        dataset = dataset.select_columns([cfg.text_field])  # don't decode the other columns
    rows = iter(dataset)
    while True:
        try:
            row = next(rows)
        except StopIteration:
            return
        except Exception as err:  # a file that breaks mid-stream (streaming, or undecodable text)
            if not is_local(os.path.expanduser(cfg.path)):
                raise
            raise explain(cfg, err) from None
        if cfg.text_field not in row:
            raise _located(cfg, ValueError(_missing_field(cfg, list(row))))
        text = row[cfg.text_field]
        if text is None:
            continue
        if not isinstance(text, str):
            raise _located(cfg, TypeError(
                f"text_field {cfg.text_field!r} holds {type(text).__name__}, not str: "
                f"set text_field to a column of strings"
            ))
        if text.strip():
            yield text


def _located(cfg: DataConfig, err: Exception) -> Exception:
    """For local files, the DataError naming the file and line behind `err` (found by reading them in full)."""
    if not is_local(os.path.expanduser(cfg.path)):
        return err
    return explain(cfg, err)


def _missing_field(cfg: DataConfig, columns) -> str:
    return (
        f"text_field {cfg.text_field!r} is not a column of {cfg.path!r}; available columns: "
        f"{', '.join(map(repr, columns))}. Set DataConfig.text_field to one of them"
    )
