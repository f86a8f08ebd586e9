"""A resume inside the corpus's longest document (~9M SmolLM2 tokens, document 4094 of the repro recipes'
shuffled stream): the seconds to the first micro-batch from a saved stream position, the recipes' packing.

    python benchmarks/resume_long_document.py --data '../shared/data/corpus/train-*.jsonl.gz' --micro-batches 1364

Before 2026-11-27 the position was (document, token) and beginning inside a document tokenised all of it:
resumed students spent 36-38 s on an H100 host (168 s on 2 busy cores here) at 16M-25M tokens. Documents are now
tokenised in pieces of `t2r.data.packing.PIECE_CHARS` characters and positions count pieces."""

import argparse
import time
from functools import partial

from t2r.sources import load_tokenizer
from t2r.train import load_recipe
from t2r.train.batches import micro_batches, packed_loader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="recipes/repro/smollm2-gsa.yaml")
    parser.add_argument("--data", default="../shared/data/corpus/train-*.jsonl.gz")
    parser.add_argument("--micro-batches", type=int, default=1364, help="where the checkpoint stands (global)")
    args = parser.parse_args()
    recipe = load_recipe(args.recipe, [f"data.path={args.data}", "eval=null"], check_files=False)
    stage = recipe.stage_list[-1]
    make = partial(packed_loader, recipe, load_tokenizer(recipe.model.source), "train", stage=stage)
    n = args.micro_batches
    began = time.perf_counter()
    position = micro_batches(make, "cpu", skip=n + 1).position(n)  # what training computes as it goes
    print(f"position after {n:,} micro-batches: {position} (read and tokenised in {time.perf_counter() - began:.1f} s)")
    for attempt in (1, 2):
        began = time.perf_counter()
        next(iter(micro_batches(make, "cpu", skip=n, start=position)))
        print(f"first micro-batch from the position: {time.perf_counter() - began:.2f} s (attempt {attempt})")


if __name__ == "__main__":
    main()
