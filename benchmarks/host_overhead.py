"""Host time vs GPU time of one op call (forward+backward): is an op launch-bound at a model's shape?

`host` is the time the Python loop takes to issue `--calls` calls without waiting, `total` the time until the
GPU has finished them; `gpu` is the kernels' own time in one call (torch.profiler, summed device time). An op whose host
time exceeds its GPU time is launch-bound: in a model the GPU then waits on Python.

    python benchmarks/host_overhead.py                      # SmolLM2 shape, 8 x 2048 tokens
    python benchmarks/host_overhead.py --shape 4,4096,32,8,128
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from t2r.ops import forgetting_attention, gla, gsa, simple_gla


def calls(B, T, HQ, H, D, slots=64):
    def rand(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    q, k, v = rand(B, T, HQ, D), rand(B, T, H, D), rand(B, T, H, D)
    gate_logits = torch.randn(B, T, H, slots, device="cuda")

    def run_gsa():
        g = F.logsigmoid(gate_logits) / 8
        gsa(q, k, v, (-g.expm1()).to(q.dtype), g)[0].sum().backward()

    def run_gla():
        gla(q, k, v, F.logsigmoid(gate_logits[..., :D]) / 16)[0].sum().backward()

    def run_simple_gla():
        simple_gla(q, k, v, F.logsigmoid(gate_logits[..., 0]) / 16)[0].sum().backward()

    def run_fox():
        forgetting_attention(q, k, v, F.logsigmoid(torch.randn(B, T, HQ, device="cuda") + 8)).sum().backward()

    def run_sdpa():
        F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                       enable_gqa=True).sum().backward()
    return {"gsa": run_gsa, "gla": run_gla, "simple_gla": run_simple_gla, "fox": run_fox, "sdpa": run_sdpa}


def measure(fn, n: int) -> tuple[float, float, float]:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    gpu = sum(e.self_device_time_total for e in prof.key_averages()) / 1e3
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t0) * 1e3 / n
    torch.cuda.synchronize()
    total = (time.perf_counter() - t0) * 1e3 / n
    return host, total, gpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="8,2048,9,3,64", help="B,T,HQ,H,D (default: SmolLM2, 8 x 2K)")
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    shape = tuple(int(x) for x in args.shape.split(","))
    print(f"{torch.cuda.get_device_name()}, B,T,HQ,H,D = {shape}, bf16, forward+backward per call\n")
    print("| op | host ms | total ms | gpu ms (one call) |\n|---|---|---|---|")
    for name, fn in calls(*shape).items():
        host, total, gpu = measure(fn, args.calls)
        print(f"| {name} | {host:.2f} | {total:.2f} | {gpu:.2f} |")


if __name__ == "__main__":
    main()
