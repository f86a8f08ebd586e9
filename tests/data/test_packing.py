"""PackedSequences and collate_packed: exact rows, positions, boundaries, and a converted model's forward."""

import pytest
import torch
from torch.utils.data import DataLoader
from transformers import DataCollatorWithFlattening

import t2r
from t2r.data import DataConfig, PackedSequences, collate_packed, load_documents
from tests.helpers.data import SENTENCES, char_tokenizer
from tests.helpers.models import tiny_source


@pytest.fixture(scope="module")
def tok():
    return char_tokenizer()


def stream(tok, texts, eos=True):
    """The reference token stream: each document's characters, then EOS."""
    out = []
    for text in texts:
        out += tok(text, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if eos else [])
    return out


def doc_starts(tok, texts, eos=True):
    starts, at = [], 0
    for text in texts:
        starts.append(at)
        at += len(tok(text, add_special_tokens=False)["input_ids"]) + eos
    return starts


def rows_of(tok, texts, seq_len, **kw):
    return list(PackedSequences(lambda: iter(texts), tok, seq_len, **kw))


@pytest.mark.parametrize("seq_len", [1, 7, 64, 300])
def test_rows_are_exact_slices_of_the_token_stream(tok, seq_len):
    rows = rows_of(tok, SENTENCES, seq_len)
    reference = stream(tok, SENTENCES)
    assert len(rows) == len(reference) // seq_len
    for row in rows:
        assert row["input_ids"].shape == row["position_ids"].shape == (seq_len,)
        assert row["input_ids"].dtype == row["position_ids"].dtype == torch.long
    flat = torch.cat([row["input_ids"] for row in rows]).tolist()
    assert flat == reference[: len(flat)]


def test_eos_after_every_document(tok):
    rows = rows_of(tok, SENTENCES, 1000)
    flat = torch.cat([row["input_ids"] for row in rows]).tolist()
    eos = tok.eos_token_id
    ends = [s - 1 for s in doc_starts(tok, SENTENCES)[1:]]
    assert [i for i, t in enumerate(flat) if t == eos] == [e for e in ends if e < len(flat)]
    assert eos not in rows_of(tok, SENTENCES, 50, add_eos=False)[0]["input_ids"].tolist()
    no_eos = torch.cat([r["input_ids"] for r in rows_of(tok, SENTENCES, 50, add_eos=False)]).tolist()
    assert no_eos == stream(tok, SENTENCES, eos=False)[: len(no_eos)]


@pytest.mark.parametrize("seq_len", [16, 45, 128])
def test_positions_restart_at_document_and_row_starts(tok, seq_len):
    rows = rows_of(tok, SENTENCES, seq_len)
    starts = doc_starts(tok, SENTENCES)
    for r, row in enumerate(rows):
        row_start = r * seq_len
        expected = []
        for i in range(row_start, row_start + seq_len):
            segment_start = max([row_start] + [s for s in starts if s <= i])
            expected.append(i - segment_start)
        assert row["position_ids"].tolist() == expected
    assert any(s % seq_len != 0 for s in starts)  # documents do run across row boundaries


def test_documents_are_reread_each_epoch_and_batching_does_not_matter(tok):
    calls = []

    def documents():
        calls.append(1)
        return iter(SENTENCES)

    data = PackedSequences(documents, tok, 32, batch_docs=3)
    first, second = list(data), list(data)
    assert len(calls) == 2
    one_by_one = list(PackedSequences(documents, tok, 32, batch_docs=1))
    for a, b, c in zip(first, second, one_by_one, strict=True):
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["input_ids"], c["input_ids"])
        assert torch.equal(a["position_ids"], c["position_ids"])


def test_bad_arguments(tok):
    with pytest.raises(ValueError, match="seq_len"):
        PackedSequences(lambda: SENTENCES, tok, 0)
    with pytest.raises(TypeError, match="callable"):
        PackedSequences(SENTENCES, tok, 8)


def check_collated(batch, rows):
    n = sum(len(row["input_ids"]) for row in rows)
    for key in ("input_ids", "position_ids", "labels"):
        assert batch[key].shape == (1, n) and batch[key].dtype == torch.long
    cu = batch["cu_seq_lens_q"]
    assert cu.dtype == torch.int32 and cu.ndim == 1 and torch.equal(cu, batch["cu_seq_lens_k"])
    starts = (batch["position_ids"][0] == 0).nonzero().flatten()
    assert cu[0] == 0 and cu[-1] == n and torch.equal(cu[:-1].long(), starts)
    lengths = cu.diff()
    assert isinstance(batch["max_length_q"], int) and batch["max_length_q"] == batch["max_length_k"] == lengths.max()
    for begin, length in zip(cu[:-1].tolist(), lengths.tolist()):  # positions count 0..length-1 in each segment
        assert batch["position_ids"][0, begin:begin + length].tolist() == list(range(length))
    labels, ids = batch["labels"][0], batch["input_ids"][0]
    assert (labels == -100).nonzero().flatten().tolist() == starts.tolist()
    keep = labels != -100
    assert torch.equal(labels[keep], ids[keep])
    assert torch.equal(ids, torch.cat([row["input_ids"] for row in rows]))


def test_collate_documents_as_segments(tok):
    rows = rows_of(tok, SENTENCES, 40)[:4]
    batch = collate_packed(rows)
    check_collated(batch, rows)
    assert len(batch["cu_seq_lens_q"]) - 1 > len(rows)  # more segments than rows: documents split them
    row_starts = torch.arange(0, 4 * 40, 40, dtype=torch.int32)
    assert torch.isin(row_starts, batch["cu_seq_lens_q"]).all()


def test_collate_rows_only(tok):
    rows = rows_of(tok, SENTENCES, 40)[:4]
    batch = collate_packed(rows, document_boundaries=False)
    check_collated(batch, rows)
    assert batch["cu_seq_lens_q"].tolist() == [0, 40, 80, 120, 160]
    assert batch["position_ids"][0].tolist() == list(range(40)) * 4
    assert batch["max_length_q"] == 40


def test_collate_matches_transformers_flattening(tok):
    rows = rows_of(tok, SENTENCES, 50)[:3]
    batch = collate_packed(rows)
    ids = batch["input_ids"][0]
    cu = batch["cu_seq_lens_q"].tolist()
    segments = [{"input_ids": ids[a:b].tolist()} for a, b in zip(cu[:-1], cu[1:])]
    expected = DataCollatorWithFlattening(return_flash_attn_kwargs=True)(segments)
    assert batch.pop("use_cache") is False  # ours also tells the model to build no cache (see below)
    assert batch.pop("stream_next") == rows[-1]["stream_next"]  # and where the rows' stream goes on
    assert expected.keys() == batch.keys()
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert value.dtype == batch[key].dtype and torch.equal(value, batch[key]), key
        else:
            assert value == batch[key], key


def test_dataloader_end_to_end_from_files(tok, text_files):
    cfg = DataConfig(path=str(text_files.json_dir), held_out=2)
    data = PackedSequences(lambda: load_documents(cfg, seed=0), tok, seq_len=32)
    batches = list(DataLoader(data, batch_size=4, collate_fn=collate_packed))
    assert batches and all(b["input_ids"].shape == (1, 4 * 32) for b in batches[:-1])
    first_doc = next(iter(load_documents(cfg, seed=0)))
    assert batches[0]["input_ids"][0, :len(first_doc)].tolist() == tok(first_doc, add_special_tokens=False)["input_ids"]


MODELS = {
    "gla": lambda source: t2r.convert(source, "gla"),
    "fox": lambda source: t2r.convert(source, "fox"),
    "hybrid": lambda source: t2r.convert(source, "gsa", layers="0,2", num_slots=8),  # layer 1 stays softmax
    "source": lambda source: source,  # a teacher: plain softmax attention, default use_cache=True
}


@pytest.mark.parametrize("model_kind", list(MODELS))
@pytest.mark.parametrize("document_boundaries", [True, False])
def test_model_on_collated_batch_equals_segments_run_alone(tok, document_boundaries, model_kind):
    """Every segment of a flattened batch is scored as if alone: the recurrent layers restart their state, and
    softmax layers (of the source as a teacher, of hybrids) see only their own segment. Without use_cache=False
    in the batch, the source's later segments were off by up to 30 logits (measured on SmolLM2)."""
    model = MODELS[model_kind](tiny_source("llama", vocab_size=len(tok))).eval()
    rows = rows_of(tok, SENTENCES, 48)[:3]
    batch = collate_packed(rows, document_boundaries=document_boundaries)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    cu = batch["cu_seq_lens_q"].tolist()
    assert len(cu) - 1 > (len(rows) if document_boundaries else len(rows) - 1)
    with torch.no_grad():
        packed = model(**inputs).logits[0]
        alone = torch.cat([model(batch["input_ids"][:, a:b]).logits[0] for a, b in zip(cu[:-1], cu[1:])])
    torch.testing.assert_close(packed, alone, rtol=1e-4, atol=1e-4)


def test_a_stream_begun_where_a_row_said_it_goes_on_gives_the_rows_that_followed(tok):
    """`stream_next` of every row, given back as `start`, continues with exactly the rows that followed it (empty
    documents, documents longer than a row, several tokenizer batches), without tokenising what came before."""
    texts = [SENTENCES[i % len(SENTENCES)] * (1 + i % 7) if i % 5 else "" for i in range(40)]
    rows = list(PackedSequences(lambda: iter(texts), tok, 16, batch_docs=3))
    assert len(rows) > 20
    for k, row in enumerate(rows):
        rest = list(PackedSequences(lambda: iter(texts), tok, 16, batch_docs=3, start=row["stream_next"]))
        assert len(rest) == len(rows) - k - 1
        for got, want in zip(rest, rows[k + 1:]):
            assert torch.equal(got["input_ids"], want["input_ids"])
            assert torch.equal(got["position_ids"], want["position_ids"])
            assert got["stream_next"] == want["stream_next"]
    calls = []
    data = PackedSequences(lambda: iter(texts), tok, 16, batch_docs=3, start=rows[-2]["stream_next"])
    data.tokenizer = lambda batch, **kw: calls.append(len(batch)) or tok(batch, **kw)
    list(data)
    assert sum(calls) == len(texts) - rows[-2]["stream_next"][0]  # the documents before `start`: read, not tokenised


LONG = ["\n".join(SENTENCES) * 3, SENTENCES[0], " ".join(SENTENCES) * 2, "", "\n".join(reversed(SENTENCES))]


@pytest.mark.parametrize("piece_chars", [1, 10, 97, 400])
def test_pieces_join_to_their_documents(piece_chars):
    from t2r.data.packing import pieces

    got = list(pieces(LONG, piece_chars))
    joined, doc = [], ""
    for text, opens, closes in got:
        assert len(text) <= max(piece_chars, 1) and (opens == (doc == ""))
        doc += text
        if closes:
            joined.append(doc)
            doc = ""
    assert joined == LONG and doc == ""
    newline_cut = [text for text, _, closes in got if not closes and "\n" in text[piece_chars // 2:]]
    assert all(text.endswith("\n") for text in newline_cut)  # cut after a newline where the span's end half has one


@pytest.mark.parametrize("piece_chars", [1, 37, 300])
def test_long_documents_pack_to_the_rows_of_whole_ones(tok, piece_chars):
    """One token per character: the pieces' rows equal the whole documents' (a document starts, and its EOS
    follows, once)."""
    whole = rows_of(tok, LONG, 50, piece_chars=10**9)
    cut = rows_of(tok, LONG, 50, piece_chars=piece_chars)
    assert len(cut) == len(whole) > 5
    for a, b in zip(cut, whole):
        assert a["input_ids"].equal(b["input_ids"]) and a["position_ids"].equal(b["position_ids"])


def test_a_stream_begun_inside_a_long_document_tokenises_from_its_piece(tok):
    """The corpus's ~9M-token document: a stream begun inside it reads its earlier pieces as text and tokenises
    only the piece it begins in onwards, and continues with the rows that followed."""
    seen = []

    class Counting:
        eos_token_id = tok.eos_token_id

        def __call__(self, texts, **kw):
            seen.extend(texts)
            return tok(texts, **kw)

    rows = rows_of(tok, LONG, 50, piece_chars=40)
    at = 6  # a row that ends inside the first document, in one of its later pieces
    index, offset = rows[at]["stream_next"]
    assert index > 1 and offset > 0
    seen.clear()
    again = list(PackedSequences(lambda: iter(LONG), Counting(), 50, piece_chars=40, start=(index, offset)))
    assert [r["input_ids"].tolist() for r in again] == [r["input_ids"].tolist() for r in rows[at + 1:]]
    assert [r["position_ids"].tolist() for r in again] == [r["position_ids"].tolist() for r in rows[at + 1:]]
    assert sum(map(len, seen)) < sum(map(len, LONG)) - 40 * (index - 1)  # the pieces before were not tokenised


def test_no_tokenizer_call_holds_more_than_a_few_pieces(tok):
    """A long document is not tokenised in one call that stalls training: each call holds at most ~5 pieces'
    characters, and the first call one piece."""
    calls = []

    class Counting:
        eos_token_id = tok.eos_token_id

        def __call__(self, texts, **kw):
            calls.append(sum(map(len, texts)))
            return tok(texts, **kw)

    rows = list(PackedSequences(lambda: iter(LONG * 3), Counting(), 50, piece_chars=40))
    assert len(rows) > 10
    assert calls[0] <= 40 and max(calls) < 5 * 40 and len(calls) > 10
