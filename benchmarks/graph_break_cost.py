"""Host cost of one torch.compile graph break per layer, as t2r's opaque Triton ops make.

A tiny Llama (30 layers, 16 tokens: the arithmetic is negligible, so a step's time is host time), compiled per
decoder layer as `bench_train.py --modes compiled` does, with its attention call (SDPA) plain or wrapped in
`torch.compiler.disable`; eager rows for reference. Each variant runs in its own process, several times; the
table gives the median step (forward + backward, no optimizer) of each run.

    python benchmarks/graph_break_cost.py            # 3 runs of each variant
    python benchmarks/graph_break_cost.py --runs 5
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

VARIANTS = ("eager", "eager, opaque attention", "compiled", "compiled, opaque attention")


def child(variant: str, steps: int = 30, warmup: int = 10) -> None:
    import torch
    import torch._dynamo.utils
    import torch.nn.functional as F
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(1)
    if "opaque" in variant:  # what transformers' sdpa_attention_forward calls, behind a compile barrier
        F.scaled_dot_product_attention = torch.compiler.disable(F.scaled_dot_product_attention)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=30,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, attn_implementation="sdpa")
    model = LlamaForCausalLM(config)
    if variant.startswith("compiled"):
        for layer in model.model.layers:
            layer.compile(dynamic=False)
    ids = torch.randint(0, config.vocab_size, (1, 16))
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
    print(f"{statistics.median(times) * 1e3:.3f} {breaks}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child)
    rows = []
    for variant in VARIANTS:
        results = [subprocess.run([sys.executable, __file__, "--child", variant], capture_output=True, text=True,
                                  check=True).stdout.split() for _ in range(args.runs)]
        ms = [float(r[0]) for r in results]
        rows.append(f"| {variant} | {statistics.median(ms):.2f} | {', '.join(f'{m:.2f}' for m in ms)} | {results[0][1]} |")
        print(rows[-1], flush=True)
    import torch

    print(f"\ntorch {torch.__version__}, 1 thread; 30 layers x 16 tokens, forward + backward\n")
    print("| variant | ms per step (median of runs) | runs | distinct graph breaks |\n|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
