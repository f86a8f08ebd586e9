"""Tokenise documents, pack them into fixed-length rows, and flatten rows into one varlen batch.

Packing wastes no tokens on padding: documents are concatenated (an EOS after each) and cut into rows
of exactly `seq_len` tokens. `collate_packed` then lays a batch of rows end to end as one sequence
`[1, B * seq_len]` with `cu_seq_lens_q` marking where each segment starts, the format of transformers'
`DataCollatorWithFlattening`, so the recurrent layers restart their state at every segment.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from itertools import islice

import torch
from torch.utils.data import IterableDataset, get_worker_info

IGNORE_INDEX = -100  # labels the loss skips (transformers' convention)
PIECE_CHARS = 262_144  # documents longer than this are tokenised piece by piece (see `pieces`)


class PackedSequences(IterableDataset):
    """Rows `{"input_ids", "position_ids"}` of exactly `seq_len` tokens cut from the tokenised documents.

    `documents` is called afresh on every iteration (e.g. `lambda: load_documents(cfg, seed)`), so an
    epoch is re-readable. Documents are tokenised `batch_docs` at a time without special tokens, and an
    EOS follows each document when `add_eos` and the tokenizer has one. The stream of all documents is
    cut into rows; the trailing partial row is dropped. `position_ids` count from 0 at every document
    start and also at every row start, so a document that runs into the next row restarts there: each
    row is self-contained, and `position_ids == 0` marks exactly the segment starts `collate_packed` uses.

    A document longer than `piece_chars` characters is tokenised in pieces (`pieces`): the stream's positions
    count pieces, so a stream begun inside a long document tokenises one piece, not all that precedes it (one
    document of the corpus holds ~9M tokens: resuming inside it cost 36 s on an H100 host, 168 s here).

    Single process only: every DataLoader worker would read the whole stream, so use `num_workers=0`
    (iterating inside a multi-worker DataLoader raises).
    """

    def __init__(self, documents: Callable[[], Iterable[str]], tokenizer, seq_len: int,
                 add_eos: bool = True, batch_docs: int = 256, start: tuple[int, int] = (0, 0),
                 piece_chars: int = PIECE_CHARS):
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        if batch_docs < 1:
            raise ValueError(f"batch_docs must be >= 1, got {batch_docs}")
        if piece_chars < 1:
            raise ValueError(f"piece_chars must be >= 1, got {piece_chars}")
        if not callable(documents):
            raise TypeError("documents must be a callable returning an iterable of strings "
                            "(e.g. `lambda: load_documents(cfg, seed)`), so every epoch can re-read them")
        self.documents = documents
        self.tokenizer = tokenizer
        self.seq_len = seq_len
        self.batch_docs = batch_docs
        self.eos_token_id = tokenizer.eos_token_id if add_eos else None
        self.start = tuple(start)
        self.piece_chars = piece_chars

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        """Rows, each with `stream_next`: (piece, token) where the stream goes on after it, the `start` a later
        iteration may begin at to continue with the next row without tokenising what came before."""
        worker = get_worker_info()
        if worker is not None and worker.num_workers > 1:
            raise RuntimeError("PackedSequences is single-process: every worker would yield the same rows; "
                               "use DataLoader(num_workers=0)")
        ids: list[int] = []       # tokens not yet emitted
        starts: list[bool] = []   # True where a document starts
        docs: list[tuple[int, int, int]] = []  # (where in `ids`, piece, its token there) of each piece in ids
        for batch in self._tokenised_batches():
            for index, offset, tokens, opens in batch:
                docs.append((len(ids), index, offset))
                ids += tokens
                starts += [opens and offset == 0] + [False] * (len(tokens) - 1)
            following = (batch[-1][0] + 1, 0) if batch else None  # the next piece, from its first token
            full = len(ids) // self.seq_len * self.seq_len
            for begin in range(0, full, self.seq_len):
                row = self._row(ids[begin:begin + self.seq_len], starts[begin:begin + self.seq_len])
                end = begin + self.seq_len
                row["stream_next"] = following if end == len(ids) else _position(docs, end)
                yield row
            del ids[:full], starts[:full]
            docs = _rebased(docs, full) if ids else []

    def _tokenised_batches(self) -> Iterator[list[tuple[int, int, list[int], bool]]]:
        """(piece index, first token kept, token ids, whether the piece opens its document) of each piece with
        tokens, from `start`, up to `batch_docs` pieces (and ~4 pieces' characters) per fast-tokenizer call, so that
        no call holds training up for long; an EOS ends each document's last piece. The pieces before `start` are
        cut from their documents, not tokenised."""
        first, dropped = self.start
        texts = enumerate(pieces(self.documents(), self.piece_chars))
        deque(islice(texts, first), maxlen=0)
        eos = [] if self.eos_token_id is None else [self.eos_token_id]
        size = 1  # the first rows come soon: batches grow from one piece (up to ~65K tokens) to batch_docs
        while batch := _take(texts, size, 4 * self.piece_chars):  # a call tokenises at most ~1M characters
            size = min(2 * size, self.batch_docs)
            encoded = self.tokenizer([text for _, (text, _, _) in batch], add_special_tokens=False,
                                     return_attention_mask=False, verbose=False)["input_ids"]
            kept = []
            for (index, (_, opens, closes)), tokens in zip(batch, encoded):
                offset = dropped if index == first else 0
                tokens = (tokens + eos if closes else tokens)[offset:] if tokens else []  # no tokens: nothing
                if tokens:
                    kept.append((index, offset, tokens, opens))
            if kept:
                yield kept

    @staticmethod
    def _row(ids: list[int], starts: list[bool]) -> dict[str, torch.Tensor]:
        starts = torch.tensor(starts)
        starts[0] = True  # every row starts a segment
        return {"input_ids": torch.tensor(ids, dtype=torch.long), "position_ids": positions_from_starts(starts)}


def pieces(documents: Iterable[str], piece_chars: int = PIECE_CHARS) -> Iterator[tuple[str, bool, bool]]:
    """(text, opens its document, closes it) of each piece of each document: a document of up to `piece_chars`
    characters is one piece; a longer one is cut after the last newline of each `piece_chars` span (or at the
    span's end where it has none in its second half). The pieces of a document join to it exactly; tokens can
    differ from the whole document's only across a cut, after a newline, where byte-level BPE pre-tokenisers
    already split."""
    for text in documents:
        begin = 0
        while len(text) - begin > piece_chars:
            cut = text.rfind("\n", begin + piece_chars // 2, begin + piece_chars) + 1 or begin + piece_chars
            yield text[begin:cut], begin == 0, False
            begin = cut
        yield text[begin:], begin == 0, True


def _take(items: Iterator[tuple[int, tuple[str, bool, bool]]], count: int, chars: int) -> list:
    """The next `count` (index, piece) items, fewer where their text reaches `chars` characters first."""
    taken, total = [], 0
    for item in items:
        taken.append(item)
        total += len(item[1][0])
        if len(taken) == count or total >= chars:
            break
    return taken


def _position(docs: list[tuple[int, int, int]], at: int) -> tuple[int, int]:
    """(piece, token) of buffer position `at`, from the (buffer position, piece, token) of each piece's first
    buffered token."""
    where, index, offset = max((d for d in docs if d[0] <= at), key=lambda d: d[0])
    return index, offset + at - where


def _rebased(docs: list[tuple[int, int, int]], cut: int) -> list[tuple[int, int, int]]:
    """`docs` after the buffer's first `cut` tokens are gone: the document holding the new first token
    starts it, at the token it had there."""
    index, offset = _position(docs, cut)
    return [(0, index, offset)] + [(where - cut, i, o) for where, i, o in docs if where > cut]


def positions_from_starts(starts: torch.Tensor) -> torch.Tensor:
    """Position of each token within its segment, given a bool mask of segment starts (token 0 always starts one)."""
    index = torch.arange(starts.numel())
    last_start = torch.where(starts, index, 0).cummax(0).values
    return index - last_start


def collate_packed(rows: list[dict], document_boundaries: bool = True) -> dict:
    """Flatten rows into one sequence `[1, N]` with varlen boundaries, like `DataCollatorWithFlattening`.

    Returns `input_ids`, `position_ids`, `labels` (`[1, N]`, int64), `cu_seq_lens_q` = `cu_seq_lens_k`
    (int32 segment starts followed by N), `max_length_q` = `max_length_k` (python int, longest segment) and
    `use_cache=False`: transformers finds the segments of a flattened batch from `position_ids` only when no
    cache is passed, and a model called with its default `use_cache=True` makes one, so its softmax layers
    would attend across segments (with restarted positions) and score every segment but the first wrongly.

    Segments are the documents inside each row (`position_ids == 0` starts one) when
    `document_boundaries`; otherwise only the rows, with documents running into each other inside a row
    separated by EOS alone (as in plain packed pretraining), and position ids renumbered 0..len-1 per row.

    `labels` equal `input_ids` except -100 at the first token of every segment: the model shifts labels
    by one internally, so that token would otherwise be predicted from the end of the previous segment,
    which the model, restarting its state at the boundary, never saw.
    """
    if not rows:
        raise ValueError("collate_packed needs at least one row")
    ids, positions = [], []
    for row in rows:
        row_ids = torch.as_tensor(row["input_ids"], dtype=torch.long).reshape(-1)
        if row_ids.numel() == 0:
            raise ValueError("collate_packed got an empty row")
        if document_boundaries:
            row_positions = torch.as_tensor(row["position_ids"], dtype=torch.long).reshape(-1)
            if row_positions.shape != row_ids.shape or row_positions[0] != 0:
                raise ValueError("every row needs position_ids as long as its input_ids, starting at 0")
        else:
            row_positions = torch.arange(row_ids.numel())
        ids.append(row_ids)
        positions.append(row_positions)
    input_ids, position_ids = torch.cat(ids), torch.cat(positions)
    starts = (position_ids == 0).nonzero().flatten()
    total = input_ids.numel()
    cu_seq_lens = torch.cat([starts, torch.tensor([total])]).to(torch.int32)
    labels = input_ids.clone()
    labels[starts] = IGNORE_INDEX
    max_length = int(cu_seq_lens.diff().max())
    batch = {
        "input_ids": input_ids[None], "position_ids": position_ids[None], "labels": labels[None],
        "cu_seq_lens_q": cu_seq_lens, "cu_seq_lens_k": cu_seq_lens.clone(),
        "max_length_q": max_length, "max_length_k": max_length, "use_cache": False,
    }
    if "stream_next" in rows[-1]:  # where the rows' stream goes on (`PackedSequences`): not a model input
        batch["stream_next"] = rows[-1]["stream_next"]
    return batch
