"""Training data as micro-batches: packed rows of the recipe's documents, one deterministic stream sharded
over processes (resumable by skipping what was trained), and the held-out loss measured on the same packing."""

from __future__ import annotations

import itertools
from functools import partial
from itertools import islice
from typing import Callable, Iterable

import torch
from torch.utils.data import DataLoader

from t2r.data import PackedSequences, collate_packed, load_documents


def packed_loader(recipe, tokenizer, part: str = "train", epoch: int = 0) -> DataLoader:
    """Micro-batches of packed rows, flattened into one sequence with document boundaries. Each
    epoch shuffles the documents with its own seed (the held-out split depends on the base seed only)."""
    cfg = recipe.data.data_config()
    seed = recipe.train.seed + epoch
    rows = PackedSequences(lambda: load_documents(cfg, seed, part), tokenizer, recipe.data.seq_len)
    collate = partial(collate_packed, document_boundaries=recipe.data.document_boundaries)
    return DataLoader(rows, batch_size=recipe.train.micro_batch_size, collate_fn=collate)


def micro_batches(make_loader: Callable[[int], Iterable[dict]], device, rank: int = 0, world: int = 1,
                  skip: int = 0, epochs: int | None = None):
    """This process's micro-batches on `device`: every `world`-th of one deterministic stream of
    epochs (`make_loader(epoch)`, repeated until `epochs`, or forever), after the first `skip` (global)
    ones, which a resumed run has already trained on. (The stream is sharded here, not by accelerate's
    loader wrapper, which slices the flattened batch's `cu_seq_lens` as if they were per-example.)"""
    index = 0
    for epoch in itertools.count() if epochs is None else range(epochs):
        start = index
        for batch in make_loader(epoch):
            if index >= skip and index % world == rank:
                yield {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
            index += 1
        if index == start:
            if epoch == 0 and epochs is None:
                raise ValueError("the training data gave no full sequence: check data.path, data.text_field "
                                 "and data.held_out, or lower data.seq_len")
            return


@torch.no_grad()
def evaluate_loss(model, loader: Iterable, max_batches: int = 50) -> float:
    """Mean next-token loss over up to `max_batches` batches (nan when the split is empty)."""
    was_training = model.training
    model.eval()
    losses = [model(**batch).loss.item() for batch in islice(loader, max_batches)]
    model.train(was_training)
    return sum(losses) / len(losses) if losses else float("nan")


def heldout_loss(model, recipe, tokenizer, device, rank: int = 0, world: int = 1) -> float:
    """Mean next-token loss on the recipe's held-out documents (`data.held_out`), packed as in training."""
    from t2r.models.packed_attention import packed_attention

    batches = micro_batches(partial(packed_loader, recipe, tokenizer, "validation"), device, rank, world, epochs=1)
    with packed_attention(model):  # packed rows' softmax layers by varlen FlashAttention on CUDA, as in training
        return evaluate_loss(model, batches)
