"""How fast a recipe's training stream tokenises and packs, alone (no model): tokens/s and CPU per micro-batch.

Under DDP every process reads the whole stream and keeps every world-th micro-batch (`MicroBatches`), so a rank
spends `world` times this CPU per micro-batch it trains; a launch-bound step shares the host with it.

    python benchmarks/bench_data_stream.py recipes/frontier/smollm2-gdn-hybrid.yaml \\
        data.path=../shared/data/corpus/train-00.jsonl.gz --micro-batches 24
"""

from __future__ import annotations

import argparse
import time

from t2r.sources import load_tokenizer
from t2r.train.batches import packed_loader
from t2r.train.recipe import load_recipe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*", help="section.field=value")
    parser.add_argument("--micro-batches", type=int, default=24, help="timed after two untimed ones")
    args = parser.parse_args()
    recipe = load_recipe(args.recipe, args.overrides)
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


if __name__ == "__main__":
    main()
