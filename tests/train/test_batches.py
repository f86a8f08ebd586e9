"""The training stream (`t2r.train.batches.MicroBatches`): a stream begun at a position it gave continues with
exactly the micro-batches that followed, across epochs and for every process of a data-parallel run."""

from functools import partial
from itertools import islice

import pytest
import torch
from torch.utils.data import DataLoader

from t2r.data import PackedSequences, collate_packed
from t2r.train.batches import micro_batches
from tests.helpers.data import SENTENCES, char_tokenizer

TEXTS = [SENTENCES[i % len(SENTENCES)] * (1 + i % 4) if i % 6 else "" for i in range(23)]


def loader(tok, epoch: int, start=(0, 0)):
    order = TEXTS[epoch % 3:] + TEXTS[:epoch % 3]  # each epoch its own order, as a seeded shuffle gives
    rows = PackedSequences(lambda: iter(order), tok, 24, batch_docs=4, start=start)
    return DataLoader(rows, batch_size=3, collate_fn=collate_packed)


def ids(batches) -> list[list[int]]:
    return [b["input_ids"][0].tolist() for b in batches]


@pytest.fixture(scope="module")
def tok():
    return char_tokenizer()


@pytest.mark.parametrize("world", [1, 2])
def test_a_stream_resumed_at_its_position_equals_the_uninterrupted_one(tok, world):
    make = partial(loader, tok)
    per_epoch = len(list(make(0)))
    assert per_epoch > 4 and all("stream_next" not in b for b in micro_batches(make, "cpu", epochs=1))
    total = 3 * per_epoch
    for rank in range(world):
        whole = ids(micro_batches(make, "cpu", rank, world, epochs=3))
        # one stream read on as training reads it, asked for its position at every step boundary (a fresh stream
        # per boundary read the same micro-batches again: twice the time, the same positions)
        stream, head = micro_batches(make, "cpu", rank, world, epochs=3), []
        for consumed in range(0, total + 1, world):  # a step boundary: every process has had its micro-batches
            own = consumed // world if rank < consumed % world or consumed % world == 0 else consumed // world + 1
            head += ids(b for _, b in zip(range(own - len(head)), stream))
            position = stream.position(consumed)
            assert position is not None and position["index"] == consumed
            resumed = micro_batches(make, "cpu", rank, world, skip=consumed, epochs=3, start=position)
            assert head + ids(resumed) == whole, (rank, consumed)


def test_a_position_past_this_process_micro_batch_is_refused(tok):
    stream = micro_batches(partial(loader, tok), "cpu", 0, 2, epochs=1)
    with pytest.raises(RuntimeError, match="would pass this process's micro-batch 0"):
        stream.position(2)


def test_a_stream_without_positions_still_skips(tok):
    """Loaders whose rows say nothing of where they stand: `skip` reads past, and no position is claimed."""
    plain = [{"input_ids": torch.tensor([[i]])} for i in range(5)]
    stream = micro_batches(lambda epoch: plain, "cpu", skip=2, epochs=2)
    assert [b["input_ids"].item() for b in stream] == [2, 3, 4, 0, 1, 2, 3, 4]
    assert micro_batches(lambda epoch: plain, "cpu", skip=5, epochs=2).position(3) is None


def test_a_stream_read_ahead_gives_the_same_micro_batches_and_positions(tok):
    """The background thread that tokenises ahead changes neither the micro-batches nor the positions a resume
    starts from."""
    make = partial(loader, tok)
    plain, early = micro_batches(make, "cpu", epochs=2, prefetch=0), micro_batches(make, "cpu", epochs=2, prefetch=3)
    assert ids(plain) == ids(early)
    for consumed in (0, 3, 7):
        positions = []
        for prefetch in (0, 2):
            stream = micro_batches(make, "cpu", epochs=2, prefetch=prefetch)
            list(islice(stream, consumed))
            positions.append(stream.position(consumed))
        assert positions[0] == positions[1] and positions[0] is not None


def test_reading_ahead_raises_the_producers_error_and_stops_with_the_consumer():
    import threading

    from t2r.train.batches import ahead

    def failing():
        yield 1
        raise ValueError("the third document is not text")

    got = ahead(failing(), 2)
    assert next(got) == 1
    with pytest.raises(ValueError, match="third document"):
        next(got)
    before = set(threading.enumerate())
    endless = ahead(iter(int, 1), 2)  # never ends: the thread must stop once the consumer closes
    assert next(endless) == 0
    (thread,) = set(threading.enumerate()) - before
    endless.close()
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_the_training_stream_marks_its_offsets_for_any_document_count(tok):
    """Every micro-batch of the stream has its packed offsets marked dynamic in length and its longest length a
    power of two (`any_document_count`): the compiled layers take every batch with one set of graphs."""
    counts = set()
    for batch in micro_batches(partial(loader, tok), "cpu", epochs=1):
        counts.add(batch["cu_seq_lens_q"].numel())
        for name in ("cu_seq_lens_q", "cu_seq_lens_k"):
            assert 0 in getattr(batch[name], "_dynamo_weak_dynamic_indices", set()), name
        longest = int(batch["cu_seq_lens_q"].diff().max())
        assert batch["max_length_q"] >= longest and batch["max_length_q"] & (batch["max_length_q"] - 1) == 0
    assert len(counts) > 1  # the stream's batches hold different numbers of documents


@pytest.mark.parametrize("world", [1, 2])
def test_a_reader_process_gives_the_threads_micro_batches_and_positions(tok, world):
    """The reader process (the default beside a GPU) changes neither the micro-batches of any rank nor the
    positions a resume starts from, nor a stream begun at one of them."""
    make = partial(loader, tok)
    for rank in range(world):
        thread = ids(micro_batches(make, "cpu", rank, world, epochs=2, reader="thread"))
        process = ids(micro_batches(make, "cpu", rank, world, epochs=2, reader="process"))
        assert process == thread and len(thread) > 4
        positions = []
        for reader in ("process", "thread"):
            stream = micro_batches(make, "cpu", rank, world, epochs=2, reader=reader)
            list(islice(stream, 3))
            positions.append(stream.position(3 * world))
            stream.close()
        position = positions[0]
        assert position == positions[1] and position is not None
        resumed = micro_batches(make, "cpu", rank, world, skip=3 * world, epochs=2, start=position, reader="process")
        assert ids(resumed) == thread[3:]


def failing_loader(epoch, start=(0, 0)):
    yield {"input_ids": torch.tensor([[1]])}
    raise ValueError("the third document is not text")


def endless_loader(epoch, start=(0, 0)):
    import itertools

    for i in itertools.count():
        yield {"input_ids": torch.tensor([[i]])}


def test_a_reader_process_raises_its_error_here_and_ends_with_the_stream():
    """...and leaves SIGINT and SIGTERM to the trainer (a terminal's Ctrl-C reaches the whole process group)."""
    import multiprocessing
    import os
    import signal

    from t2r.train.readers import start_readers

    start_readers()
    stream = iter(micro_batches(failing_loader, "cpu", epochs=1, reader="process"))
    assert next(stream)["input_ids"].item() == 1
    with pytest.raises(ValueError, match="the third document is not text"):
        next(stream)
    before = set(multiprocessing.active_children())
    endless = micro_batches(endless_loader, "cpu", reader="process")
    assert [b["input_ids"].item() for b in islice(endless, 3)] == [0, 1, 2]
    (reader,) = set(multiprocessing.active_children()) - before
    for stop in (signal.SIGINT, signal.SIGTERM):
        os.kill(reader.pid, stop)
    assert [b["input_ids"].item() for b in islice(endless, 20)] == list(range(3, 23)) and reader.is_alive()
    endless.close()
    reader.join(timeout=10)
    assert not reader.is_alive()
    with pytest.raises(ValueError, match="reader='fork': one of auto, process, thread"):
        micro_batches(endless_loader, "cpu", reader="fork")


class Unpicklable:
    def __reduce__(self):
        raise TypeError("cannot pickle 'tokenizers.Tokenizer' object")


def test_a_stream_that_cannot_reach_a_reader_process_says_to_read_it_in_a_thread():
    """A tokenizer that cannot be pickled (a user's own) fails in one line that names the way out."""
    held = Unpicklable()
    stream = micro_batches(partial(endless_loader_with, held), "cpu", reader="process")
    with pytest.raises(ValueError, match="cannot be sent to a reader process .*set data.reader=thread"):
        next(iter(stream))
    assert next(iter(micro_batches(partial(endless_loader_with, held), "cpu", reader="thread")))["input_ids"] == 0


def endless_loader_with(tokenizer, epoch, start=(0, 0)):
    return endless_loader(epoch, start)
