"""Where the training text comes from: one dataclass, shared by the loaders and the recipes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DataConfig:
    """A text source for finetuning.

    ``path`` is a Hugging Face hub dataset id (``"cerebras/SlimPajama-627B"``), a local file
    (``.txt``, ``.jsonl``/``.json``, optionally ``.gz``; ``.parquet``), a directory of such
    files, or a glob. Documents are shuffled by the run's seed; the first ``held_out`` of them
    (after shuffling) are kept aside as the validation split and never trained on.
    """

    path: str
    name: str | None = None          # hub dataset configuration
    split: str = "train"
    text_field: str = "text"
    streaming: bool | None = None    # default: True for hub ids, False for local files
    held_out: int = 0                # documents kept aside for validation
    shuffle_buffer: int = 10_000     # streaming shuffle buffer (documents)
    max_documents: int | None = None  # stop after this many training documents
    max_skipped: float = 0.01        # most rows without text (field missing, null, blank) skipped; more: refused
