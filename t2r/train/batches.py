"""Training data as micro-batches: packed rows of the recipe's documents, one deterministic stream sharded
over processes (resumable by skipping what was trained), and the held-out loss measured on the same packing."""

from __future__ import annotations

import atexit
import pickle
import queue
import threading
import warnings
from functools import partial
from itertools import islice
from typing import Callable, Iterable, Iterator

import torch
from torch.utils.data import DataLoader, IterableDataset

from t2r.data import PackedSequences, collate_packed, load_documents
from t2r.models.compilation import any_document_count

from .readers import PREFETCH, reader_context, resolved_reader


def packed_loader(recipe, tokenizer, part: str = "train", epoch: int = 0, start: tuple[int, int] = (0, 0),
                  stage=None) -> DataLoader:
    """Micro-batches of packed rows, flattened into one sequence with document boundaries. Each
    epoch shuffles the documents with its own seed (the held-out split depends on the base seed only). `start`:
    (piece, token) of the epoch's stream to begin at (`MicroBatches.position`). Rows of `data.seq_len` tokens,
    `train.micro_batch_size` a micro-batch, or those of `stage` (a `StageSection`); the training part gives whole
    micro-batches only."""
    cfg = recipe.data.data_config()
    seed = recipe.train.seed + epoch
    seq_len, micro = ((stage.seq_len, stage.micro_batch_size) if stage is not None else
                      (recipe.data.seq_len, recipe.train.micro_batch_size))
    rows = PackedSequences(lambda: load_documents(cfg, seed, part), tokenizer, seq_len, start=start)
    collate = partial(collate_packed, document_boundaries=recipe.data.document_boundaries)
    # training: only whole micro-batches, so every step trains on train.tokens_per_step tokens and a compiled
    # step never meets a shorter shape (its recompilation cost 58 s at an epoch's end on an H100, 2026-11-27);
    # the epoch's last rows, fewer than a micro-batch, are left out
    return DataLoader(rows, batch_size=micro, collate_fn=collate, drop_last=part == "train")


_EXITING = threading.Event()  # set at interpreter exit: every reading-ahead thread stops


@atexit.register
def _stop_reading_ahead() -> None:
    _EXITING.set()
    for thread in threading.enumerate():
        if thread.name == "t2r-micro-batches":
            thread.join(timeout=5)


def ahead(items: Iterable, depth: int) -> Iterator:
    """The items of `items`, in order, read up to `depth` ahead by a background thread: the
    fast tokenizer (which releases the GIL) and the packing run while the GPU trains on the micro-batch before.
    An error in the thread is raised here; the thread stops once the consumer stops. depth 0: no thread."""
    if depth <= 0:
        yield from items
        return
    done, queued, stop = object(), queue.Queue(maxsize=depth), threading.Event()

    def put(entry) -> bool:
        while not (stop.is_set() or _EXITING.is_set()):
            try:
                queued.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def fill():
        try:
            for item in items:
                if not put((item, None)):
                    return
            put((done, None))
        except BaseException as error:  # raised again in the consumer, with its traceback
            put((None, error))

    thread = threading.Thread(target=fill, name="t2r-micro-batches", daemon=True)
    thread.start()
    try:
        while True:
            item, error = queued.get()
            if error is not None:
                raise error
            if item is done:
                return
            yield item
    finally:
        stop.set()


def _reader_ignores_stop_signals(worker_id: int) -> None:
    """A reader leaves SIGINT and SIGTERM to the trainer, which finishes its step on them (a terminal's Ctrl-C and
    a scheduler's SIGTERM reach every process of the group): the step's micro-batches still come. It ends with
    the stream, or with the trainer (DataLoader's watchdog)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


class _Epoch(IterableDataset):
    """One epoch of a stream from `begin`, made where it is iterated (in a reader process: `make_loader`
    travels there pickled)."""

    def __init__(self, make_loader: Callable[..., Iterable[dict]], epoch: int, begin: tuple[int, int]):
        self.make_loader, self.epoch, self.begin = make_loader, epoch, begin

    def __iter__(self):
        yield from (self.make_loader(self.epoch, start=self.begin) if self.begin != (0, 0)
                    else self.make_loader(self.epoch))


def in_reader_process(make_loader: Callable[..., Iterable[dict]], epoch: int, begin: tuple[int, int],
                      depth: int) -> Iterator[dict]:
    """The micro-batches of `_Epoch(make_loader, epoch, begin)`, made `depth` ahead in a process of their own: a
    reading thread shares the GIL with the thread that launches the GPU's kernels, and tokenising and packing a
    micro-batch flat out slowed a Python-bound loop beside it to 0.54-0.75x (benchmarks/bench_data_stream.py --gil).
    The process is forked from a forkserver that imported only this module (never from the trainer, which holds
    CUDA, NCCL and compile threads); it ends with the epoch, or when the consumer stops."""
    loader = DataLoader(_Epoch(make_loader, epoch, begin), batch_size=None, num_workers=1,
                        prefetch_factor=max(depth, 1), multiprocessing_context=reader_context(),
                        worker_init_fn=_reader_ignores_stop_signals)
    try:
        with warnings.catch_warnings():  # torch's own advice there (the fork start method) is not ours
            warnings.filterwarnings("ignore", message="Got pickle error")
            items = iter(loader)  # the stream (its tokenizer too) is pickled to the reader here
    except (pickle.PicklingError, TypeError, AttributeError) as error:
        raise ValueError(f"the training stream cannot be sent to a reader process ({error}): set data.reader=thread "
                         "to read it in a thread of this process") from error
    # a reader ignores SIGTERM, so multiprocessing's exit hook (SIGTERM, then join) would wait on one left open
    # forever: it is shut down first, at exit at the latest (atexit runs the hooks registered last first)
    atexit.register(items._shutdown_workers)
    try:
        yield from items
    finally:
        atexit.unregister(items._shutdown_workers)
        items._shutdown_workers()


class MicroBatches:
    """This process's micro-batches on `device`: every `world`-th of one deterministic stream of
    epochs (`make_loader(epoch)`, repeated until `epochs`, or forever), after the first `skip` (global)
    ones, which a resumed run has already trained on. (The stream is sharded here, not by accelerate's
    loader wrapper, which slices the flattened batch's `cu_seq_lens` as if they were per-example.)

    `position(n)` is where the stream stands after its first n micro-batches (epoch, global index, and the
    (piece, token) a packed loader's `start` takes, with `key`: what else the caller needs to recognise its
    stream); given back as `start`, the stream begins there instead of reading and tokenising everything before
    `skip` again, which a resume at billions of tokens could not afford."""

    def __init__(self, make_loader: Callable[..., Iterable[dict]], device, rank: int = 0, world: int = 1,
                 skip: int = 0, epochs: int | None = None, start: dict | None = None, key: dict | None = None,
                 prefetch: int = PREFETCH, reader: str | None = None):
        if start is not None and start["index"] > skip:
            raise ValueError(f"a stream position at micro-batch {start['index']} is past skip={skip}")
        self.make_loader, self.device, self.rank, self.world, self.skip = make_loader, device, rank, world, skip
        self.epochs, self.key = epochs, dict(key or {})
        self.prefetch, self.pinned = prefetch, torch.device(device).type == "cuda"  # copies beside the host
        self.reader = resolved_reader(reader, self.pinned, prefetch)
        self.at = ({"epoch": start["epoch"], "index": start["index"], "doc": start["doc"], "offset": start["offset"]}
                   if start is not None else {"epoch": 0, "index": 0, "doc": 0, "offset": 0})
        self._stream = self._all()

    def _all(self):
        """(global index, micro-batch) of the whole stream from `self.at`, which follows it."""
        epoch = self.at["epoch"]
        while self.epochs is None or epoch < self.epochs:
            begin = (self.at["doc"], self.at["offset"])
            first = self.at["index"]
            if self.reader == "process":
                read = in_reader_process(self.make_loader, epoch, begin, self.prefetch)
            else:
                read = ahead(_Epoch(self.make_loader, epoch, begin), self.prefetch)
            try:
                for batch in read:
                    following = batch.pop("stream_next", None)
                    index = self.at["index"]
                    self.at = {"epoch": epoch, "index": index + 1, "doc": None, "offset": None}
                    if following is not None:
                        self.at.update(doc=following[0], offset=following[1])
                    yield index, batch
            finally:  # the reader stops with the stream, not when the garbage collector finds it
                read.close()
            if self.at["index"] == first and begin == (0, 0):  # a whole epoch without one micro-batch
                if epoch == 0 and self.epochs is None:
                    raise ValueError("the training data gave no full micro-batch (train.micro_batch_size rows of "
                                     "data.seq_len tokens): check data.path, data.text_field and data.held_out, or "
                                     "lower data.seq_len or train.micro_batch_size")
                return
            epoch += 1
            self.at = {"epoch": epoch, "index": self.at["index"], "doc": 0, "offset": 0}

    def __iter__(self):
        for index, batch in self._stream:
            if index >= self.skip and index % self.world == self.rank:
                # only this process's micro-batches are pinned: the others' and those skipped are dropped
                yield any_document_count({k: (v.pin_memory() if self.pinned else v).to(
                    self.device, non_blocking=self.pinned) if torch.is_tensor(v) else v for k, v in batch.items()})

    def close(self) -> None:
        """Stop reading ahead (the stream ends here)."""
        self._stream.close()

    def position(self, consumed: int) -> dict | None:
        """Where the stream stands after its first `consumed` micro-batches, read on, past micro-batches of the
        other processes only, where this process has not reached it; None where that is not known."""
        while self.at["index"] < consumed:
            try:
                index, _ = next(self._stream)
            except StopIteration:
                return None
            if index >= self.skip and index % self.world == self.rank:
                raise RuntimeError(f"position({consumed}) would pass this process's micro-batch {index}")
        if self.at["index"] != consumed or self.at["doc"] is None:
            return None
        return {**self.at, **self.key}


def micro_batches(make_loader: Callable[..., Iterable[dict]], device, rank: int = 0, world: int = 1,
                  skip: int = 0, epochs: int | None = None, start: dict | None = None,
                  key: dict | None = None, prefetch: int = PREFETCH, reader: str | None = None) -> MicroBatches:
    """`MicroBatches(...)`: this process's share of the stream, from `start` (a `position`) when given."""
    return MicroBatches(make_loader, device, rank, world, skip, epochs, start, key, prefetch, reader)


def heldout_loss(model, recipe, tokenizer, device, rank: int = 0, world: int = 1, max_batches: int = 50) -> float:
    """Mean next-token loss on the recipe's held-out documents (`data.held_out`), packed as in training: the
    first `max_batches` micro-batches, shared among the `world` processes, which agree on the mean (the final
    metrics and the collapse guard decide alike everywhere). Every process runs as many forwards, one of them
    a repeat where the micro-batches do not divide evenly: a sharded model gathers its weights in each forward,
    and a process with one forward fewer left the others waiting (FSDP2 on two H100s, 2026-11-27). Eager even
    where the layers are compiled (`train.compile`): graphs for a few evaluation-mode forwards, before training
    and after, would take longer to compile than these forwards take to run."""
    from t2r.models.packed_attention import packed_attention

    stream = micro_batches(partial(packed_loader, recipe, tokenizer, "validation"), device, epochs=1, prefetch=0)
    batches = list(islice(stream, max_batches))  # the held-out part is small: every process reads all of it
    if not batches:
        return float("nan")
    mine, rounds = batches[rank::world], -(-len(batches) // world)
    total = torch.zeros((), dtype=torch.float64, device=device)
    was_training = model.training
    model.eval()
    # packed rows by varlen FlashAttention on CUDA, as in training
    with torch.no_grad(), packed_attention(model), torch.compiler.set_stance("force_eager"):
        for k in range(rounds):
            if k < len(mine):
                total += model(**mine[k]).loss.double()
            else:
                model(**batches[0])  # the forward the other processes make this round; its loss is not counted
    model.train(was_training)
    if world > 1:
        torch.distributed.all_reduce(total)
    return total.item() / len(batches)
