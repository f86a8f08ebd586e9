"""A model directory of a hub model's shape with random weights, for measuring what its size costs offline.

The GPU machines reach no hub, so the 7B recipes' memory and speed under FSDP2 (issue 39) are measured on a
model of the same shape: the config of one of `t2r.models.known_configs.KNOWN_CONFIGS` (Mistral-7B, Llama-3-8B),
the vocabulary resized to a tokenizer at hand (SmolLM2's 49,152 entries by default: the embedding and the
output projection change, every decoder layer is the source's), weights drawn by transformers' own init on the
GPU and written as safetensors with the tokenizer beside them. Any recipe then runs it with
`model.source=DIR`.

    python benchmarks/random_model.py --like mistralai/Mistral-7B-v0.1 --out /tmp/mistral-7b-random
    python benchmarks/random_model.py --like mistralai/Mistral-7B-v0.1 --layers 2 --device cpu --out /tmp/m2  # smoke
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from t2r.models.known_configs import KNOWN_CONFIGS, known_config
from t2r.sources import load_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--like", choices=sorted(KNOWN_CONFIGS), default="mistralai/Mistral-7B-v0.1")
    parser.add_argument("--tokenizer", default="smollm2", help="a model spec whose tokenizer the directory gets")
    parser.add_argument("--layers", type=int, default=None, help="keep the first N decoder layers (a smoke test)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.out.exists() and any(args.out.iterdir()):
        raise SystemExit(f"random_model: {args.out} is not empty; name a new directory")

    start = time.perf_counter()
    tokenizer = load_tokenizer(args.tokenizer)
    config = known_config(args.like)
    config.vocab_size = len(tokenizer)
    config.bos_token_id, config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    if args.layers is not None:
        config.num_hidden_layers = args.layers
    torch.manual_seed(args.seed)
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, args.dtype))
    built = time.perf_counter() - start
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    size = sum(f.stat().st_size for f in args.out.iterdir()) / 2**30
    params = sum(p.numel() for p in model.parameters()) / 1e9
    print(f"random_model: {args.out}: {args.like}'s shape, {config.num_hidden_layers} layers, vocabulary "
          f"{config.vocab_size} ({args.tokenizer}'s tokenizer), {params:.2f}B parameters in {args.dtype}, "
          f"{size:.1f} GiB; built in {built:.1f} s, written in {time.perf_counter() - start - built:.1f} s")


if __name__ == "__main__":
    main()
