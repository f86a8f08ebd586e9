"""Rows of token ids from a `DataConfig`'s documents, for measurements on fixed text: perplexity by position
(`t2r.eval.perplexity`) and the calibration of a conversion (`t2r.convert.calibration`)."""

from __future__ import annotations

import torch

from .config import DataConfig
from .documents import load_documents


def token_rows(data: DataConfig, tokenizer, length: int, rows: int, seed: int = 0, pack: bool = False,
               part: str = "validation") -> torch.Tensor:
    """`[rows, length]` token ids of held-out text: each of the first documents with at least `length`
    tokens, cut to `length` (positions are positions in the document); with `pack`, documents joined by
    EOS and cut into rows (positions are positions in the stream). Raises if the text is too short."""
    rows_out, stream, seen = [], [], 0
    eos = tokenizer.eos_token_id
    for text in load_documents(data, seed, part):
        seen += 1
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if pack:
            stream += ids + ([eos] if eos is not None else [])
            while len(stream) >= length and len(rows_out) < rows:
                rows_out.append(stream[:length])
                stream = stream[length:]
        elif len(ids) >= length:
            rows_out.append(ids[:length])
        if len(rows_out) >= rows:
            break
    if not rows_out:
        how = "joined together" if pack else "with at least that many tokens each (pack=True joins documents)"
        raise ValueError(f"{data.path}: {seen} held-out documents give no row of {length} tokens {how}; "
                         "lower the length or use more documents (data.held_out)")
    return torch.tensor(rows_out, dtype=torch.long)
