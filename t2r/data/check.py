"""Data checks that run before a model loads: every error names the file, the line and the fix.

`check_files` (`t2r.data.files`) reads every local file of a `DataConfig` with plain Python; `check_skipped` counts
the rows the stream skips (no text) and refuses too many; `check_rows` then tokenises the real training and
held-out streams until each gives one packed row of `seq_len` tokens.
"""

from __future__ import annotations

from .config import DataConfig
from .documents import load_documents, rows_without_text
from .files import DataError, check_files, files_read, first_without_text
from .packing import PackedSequences

__all__ = ["DataError", "check_files", "check_rows", "check_skipped", "data_notes"]


def data_notes(cfg: DataConfig) -> str | None:
    """What a run says about its data before it trains: the files a directory or glob gives (`files_read`) and the
    rows without text it skips (`check_skipped`, which refuses too many); None when there is nothing to say."""
    return "\n".join(note for note in (files_read(cfg), check_skipped(cfg)) if note) or None


def check_skipped(cfg: DataConfig) -> str | None:
    """DataError when more than `cfg.max_skipped` of the rows of `cfg`'s local files hold no text (the field
    missing, null or blank: the stream skips them); else one line saying how many are skipped and where the
    first is, or None when none is (or for a hub dataset, not read ahead)."""
    counted = rows_without_text(cfg)
    if not counted or not counted[0]:
        return None
    skipped, total = counted
    what = (f"data: {skipped:,} of {total:,} rows ({skipped / total:.2%}) have no text in {cfg.text_field!r} "
            f"(missing, null or blank; the first: {first_without_text(cfg)})")
    if skipped > cfg.max_skipped * total:
        raise DataError(f"{what}, more than data.max_skipped={cfg.max_skipped:g}: fix or delete those rows, set "
                        "data.text_field to the field holding the text, or raise data.max_skipped")
    return f"{what}: skipped"


def check_rows(cfg: DataConfig, tokenizer, seq_len: int, seed: int) -> None:
    """DataError unless the training part, and the held-out part when `cfg.held_out`, each give at least
    one packed row of `seq_len` tokens (the held-out loss is nan without one)."""
    for part in ("train", "validation") if cfg.held_out else ("train",):
        rows = PackedSequences(lambda: load_documents(cfg, seed, part), tokenizer, seq_len)
        if next(iter(rows), None) is not None:
            continue
        docs = list(load_documents(cfg, seed, part))
        tokens = sum(len(ids) + 1 for ids in tokenizer(docs, add_special_tokens=False)["input_ids"]) if docs else 0
        if part == "validation":
            raise DataError(f"data.held_out: the {len(docs)} held-out documents hold {tokens} tokens, less than one "
                            f"row of data.seq_len={seq_len}, so the held-out loss would be nan; raise data.held_out "
                            "or lower data.seq_len")
        raise DataError(f"data: the training documents ({len(docs)} after the {cfg.held_out} held out) hold {tokens} "
                        f"tokens, less than one row of data.seq_len={seq_len}; add data, or lower data.held_out or "
                        "data.seq_len")
