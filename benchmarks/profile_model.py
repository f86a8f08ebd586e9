"""Where a whole-model training step spends its time: torch.profiler over the loop of `bench_train.py`.

Prints, per model, the wall time of a step, the GPU's busy time in it (kernels summed: a wide gap means the GPU
waits on the host) and the top operators by GPU time, so the overhead a converted layer adds shows by name.

    python benchmarks/profile_model.py --models source gsa --context 2048 --tokens-per-step 16384
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import LlamaConfig, LlamaForCausalLM

import t2r

sys.path.insert(0, str(Path(__file__).parent))
from bench_train import SHAPES  # noqa: E402


def step_fn(model, ids):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2")
    parser.add_argument("--models", nargs="+", default=["source", "gsa"])
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--tokens-per-step", type=int, default=16384)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    torch.manual_seed(0)
    source = LlamaForCausalLM(LlamaConfig(**SHAPES[args.shape], attn_implementation="sdpa")).cuda().train()
    ids = torch.randint(0, source.config.vocab_size, (args.tokens_per_step // args.context, args.context),
                        device="cuda")
    for name in args.models:
        model = source if name == "source" else t2r.convert(source, name).train()
        step = step_fn(model, ids)
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        start = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        wall = (time.perf_counter() - start) * 1e3
        events = prof.key_averages()
        busy = sum(e.self_device_time_total for e in events) / 1e3
        print(f"\n== {name}: step {wall:.1f} ms under the profiler, GPU busy {busy:.1f} ms")
        print(events.table(sort_by="self_device_time_total", row_limit=args.top, max_name_column_width=60))
        if model is not source:
            del model


if __name__ == "__main__":
    main()
