"""Wall time of a layer ranking on the device it runs on: `rank_layers` as the frontier recipe asks it
(`kl+recall`, `keep-one`, gdn + window 64 + 4 sinks), on 4 rows of 512 text tokens and 4 recall prompts of 520,
random weights of SmolLM2's shape (time does not depend on their values). Twice: the first call includes the
kernels' compilation.

    python benchmarks/rank_layers_time.py          # H100, 2026-11-26: 10.3 s, then 9.5 s
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from t2r.convert.sensitivity import rank_layers

sys.path.insert(0, str(Path(__file__).parent))
from bench_train import SHAPES  # noqa: E402


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    source = LlamaForCausalLM(LlamaConfig(**SHAPES["smollm2"], attn_implementation="sdpa")).to(device)
    ids = torch.randint(0, source.config.vocab_size, (4, 512))
    recall = (torch.randint(0, source.config.vocab_size, (4, 520)), torch.rand(4, 520) < 0.1)
    for i in range(2):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        ranking = rank_layers(source, "gdn", ids, progress=False, recall=recall, criterion="kl+recall",
                              sweep="keep-one", window=64, sinks=4)
        if device == "cuda":
            torch.cuda.synchronize()
        print(f"ranking {i}: {time.perf_counter() - start:.1f} s on {device}; kept {ranking.most_sensitive(8)}")


if __name__ == "__main__":
    main()
