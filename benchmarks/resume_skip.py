"""What a resume pays to reach its place in the training data: the stream read and tokenised up to the
checkpoint's micro-batch (`skip`, as before 2026-11-27) against the stream begun at the position the checkpoint
saved (`start`), both to the same next micro-batch, whose tokens are checked equal.

    python benchmarks/resume_skip.py --data ../shared/data/corpus/train-00.jsonl.gz --micro-batches 50 200

Prints one row per skip: tokens skipped, seconds to the next micro-batch each way. Default tokenizer: SmolLM2's
(`t2r.sources`), 2048-token rows, micro-batches of 8."""

import argparse
import time
from functools import partial

from torch.utils.data import DataLoader

from t2r.data import DataConfig, PackedSequences, collate_packed, load_documents
from t2r.train.batches import micro_batches


def loader(cfg, tokenizer, seq_len, micro_batch_size, epoch, start=(0, 0)):
    rows = PackedSequences(lambda: load_documents(cfg, epoch, "train"), tokenizer, seq_len, start=start)
    return DataLoader(rows, batch_size=micro_batch_size, collate_fn=collate_packed)


def timed_next(stream):
    began = time.perf_counter()
    batch = next(iter(stream))
    return time.perf_counter() - began, batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--tokenizer", default="smollm2")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[50, 200])
    args = parser.parse_args()
    if args.tokenizer == "smollm2":
        from t2r.sources import load_source
        tokenizer = load_source("smollm2")[1]
    else:
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    cfg = DataConfig(path=args.data)
    make = partial(loader, cfg, tokenizer, args.seq_len, args.micro_batch_size)
    list(zip(range(2), load_documents(cfg, 0, "train")))  # the file parsed once (datasets' cache), for both
    print("| micro-batches skipped | tokens | read and tokenised (s) | begun at the saved position (s) |")
    print("|---|---|---|---|")
    for n in args.micro_batches:
        position = micro_batches(make, "cpu", skip=n + 1).position(n)
        slow, a = timed_next(micro_batches(make, "cpu", skip=n))
        fast, b = timed_next(micro_batches(make, "cpu", skip=n, start=position))
        assert a["input_ids"].equal(b["input_ids"]), "the two ways reached different micro-batches"
        print(f"| {n:,} | {n * args.seq_len * args.micro_batch_size:,} | {slow:.1f} | {fast:.2f} |")


if __name__ == "__main__":
    main()
