"""How fast a recipe's training stream tokenises and packs, alone (no model): tokens/s and CPU per micro-batch.

Under DDP every process reads the whole stream and keeps every world-th micro-batch (`MicroBatches`), so a rank
spends `world` times this CPU per micro-batch it trains; a launch-bound step shares the host with it.

    python benchmarks/bench_data_stream.py recipes/frontier/smollm2-gdn-hybrid.yaml \\
        data.path=../shared/data/corpus/train-00.jsonl.gz --micro-batches 24
    python benchmarks/bench_data_stream.py ... --gil 8

`--gil S`: what the stream takes from the thread that launches a GPU's kernels. A Python-bound loop of tiny torch
ops (a launch-bound step's host side) runs S seconds alone, then S seconds beside the stream read flat out by a
thread (how t2r read ahead until 2026-11-27) or by a reader process (`MicroBatches(reader="process")`, the
default beside a GPU), twice each, alternating: its rate beside each over its rate alone just before. With
TOKENIZERS_PARALLELISM=false the tokenizer keeps to one core, so on a small machine the thread's loss is the
GIL's, not the cores'.
"""

from __future__ import annotations

import argparse
import threading
import time
from functools import partial

import torch

from t2r.sources import load_tokenizer
from t2r.train.batches import micro_batches, packed_loader
from t2r.train.recipe import load_recipe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*", help="section.field=value")
    parser.add_argument("--micro-batches", type=int, default=24, help="timed after two untimed ones")
    parser.add_argument("--gil", type=float, default=0, metavar="S",
                        help="seconds of a Python-bound loop alone, beside a reading thread, beside a reader process")
    args = parser.parse_args()
    recipe = load_recipe(args.recipe, args.overrides)
    if args.gil:
        return beside_the_stream(recipe, args.gil)
    stream = iter(packed_loader(recipe, load_tokenizer(recipe.model.source)))
    for _ in range(2):  # the files opened, the first buffer shuffled
        next(stream)
    wall, cpu, tokens = time.perf_counter(), time.process_time(), 0
    for _ in range(args.micro_batches):
        batch = next(stream)
        tokens += batch["input_ids"].numel()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"{args.micro_batches} micro-batches of {tuple(batch['input_ids'].shape)} tokens: {tokens / wall:,.0f} "
          f"tokens/s, {cpu / args.micro_batches * 1000:.0f} ms of CPU per micro-batch ({cpu / wall:.2f} cores busy)")


def python_bound_loop(seconds: float) -> float:
    """Iterations a second of two in-place ops on a tiny tensor: dispatch in Python, no arithmetic to speak of."""
    x, n = torch.zeros(8), 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(100):
            x.add_(1.0).mul_(0.5)
        n += 100
    return n / seconds


def beside_the_stream(recipe, seconds: float) -> None:
    torch.set_num_threads(1)
    make = partial(packed_loader, recipe, load_tokenizer(recipe.model.source), "train")
    print(f"{'reader':<9} {'loop ops/s':>11} {'vs alone':>9} {'micro-batches/s':>16}  (alone measured before each)")
    for reader in ("thread", "process") * 2:
        alone = python_bound_loop(seconds)
        batches = micro_batches(make, "cpu", reader=reader)
        stream = iter(batches)
        next(stream)  # the reader started, the files opened
        stop, pulled = threading.Event(), [0]

        def pull():
            while not stop.is_set():
                next(stream)
                pulled[0] += 1

        puller = threading.Thread(target=pull, daemon=True)
        puller.start()
        rate = python_bound_loop(seconds)
        stop.set()
        puller.join()
        batches.close()
        print(f"{reader:<9} {rate:>11,.0f} {rate / alone:>9.2f} {pulled[0] / seconds:>16.2f}")


if __name__ == "__main__":
    main()
