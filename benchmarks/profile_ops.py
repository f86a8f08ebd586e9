"""Per-kernel CUDA time of one forward+backward of t2r's ops (torch.profiler), bf16, one GPU.

    python benchmarks/profile_ops.py                                  # all ops, Mistral layer shape
    python benchmarks/profile_ops.py --ops gla gsa --shape 1,32768,32,8,128

Shape is B,T,HQ,H,D (GSA uses 64 slots). Gates as in the benchmarks: logsigmoid(randn)/16 for
GLA and simple GLA, logsigmoid(randn)/8 for GSA, logsigmoid(randn) for forgetting attention.
Gradients are taken with torch.autograd.grad, so no .grad accumulation is timed.
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from t2r.ops import forgetting_attention, gla, gsa, simple_gla  # noqa: E402

DEV, DT, SLOTS = "cuda", torch.bfloat16, 64


def make(op, B, T, HQ, H, D):
    rand = lambda *shape: torch.randn(*shape, device=DEV, dtype=DT)  # noqa: E731
    q, k, v = rand(B, T, HQ, D), rand(B, T, H, D), rand(B, T, H, D)
    if op == "simple_gla":
        args = (q, k, v, (F.logsigmoid(rand(B, T, H).float()) / 16).to(DT))
        return lambda *a: simple_gla(*a)[0], args
    if op == "gla":
        args = (q, k, v, (F.logsigmoid(rand(B, T, H, D).float()) / 16).to(DT))
        return lambda *a: gla(*a)[0], args
    if op == "gsa":
        g = F.logsigmoid(rand(B, T, H, SLOTS).float()) / 8
        args = (q, k, v, (1 - g.exp()).to(DT), g.to(DT))
        return lambda *a: gsa(*a)[0], args
    if op == "fox":
        args = (q, k, v, F.logsigmoid(rand(B, T, HQ).float()).to(DT))
        return lambda *a: forgetting_attention(*a), args
    raise ValueError(f"unknown op {op!r}; choose simple_gla, gla, gsa or fox")


def profile(op, shape, iters=5):
    fn, args = make(op, *shape)
    args = [a.requires_grad_(True) for a in args]
    do = torch.randn(*shape[:3], shape[4], device=DEV, dtype=DT)

    def step():
        torch.autograd.grad(fn(*args), args, do)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    rows = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            rows[e.name] = rows.get(e.name, 0.0) + e.device_time_total / 1000 / iters
    lines = [f"### {op}, B,T,HQ,H,D = {','.join(map(str, shape))} ({torch.cuda.get_device_name()})", "",
             "| kernel | ms |", "|---|---|"]
    for name, t in sorted(rows.items(), key=lambda x: -x[1]):
        lines.append(f"| {name[:70]} | {t:.3f} |")
    lines.append(f"| **sum** | {sum(rows.values()):.3f} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", nargs="+", default=["simple_gla", "gla", "gsa", "fox"])
    ap.add_argument("--shape", default="4,4096,32,8,128", help="B,T,HQ,H,D")
    args = ap.parse_args()
    shape = tuple(int(x) for x in args.shape.split(","))
    for op in args.ops:
        print(profile(op, shape), flush=True)


if __name__ == "__main__":
    main()
