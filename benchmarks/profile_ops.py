"""Per-kernel CUDA time of one forward+backward of t2r's ops (torch.profiler), bf16, one GPU.

    python benchmarks/profile_ops.py                                  # all ops, Mistral layer shape
    python benchmarks/profile_ops.py --ops gla gsa --shape 1,32768,32,8,128
    python benchmarks/profile_ops.py --gsa-regs          # no GPU needed, see gsa_registers

Shape is B,T,HQ,H,D (GSA uses 64 slots). Gates as in the benchmarks: logsigmoid(randn)/16 for
GLA and simple GLA, logsigmoid(randn)/8 for GSA, logsigmoid(randn) for forgetting attention and the gated
delta rule (unit-norm keys, beta = sigmoid(randn)).
Gradients are taken with torch.autograd.grad, so no .grad accumulation is timed.
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from t2r.ops import forgetting_attention, gated_delta_rule, gla, gsa, simple_gla  # noqa: E402

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
    if op == "gated_delta":
        k = F.normalize(k.float(), dim=-1).to(DT)
        args = (q, k, v, F.logsigmoid(rand(B, T, H).float()), rand(B, T, H).float().sigmoid())
        return lambda *a: gated_delta_rule(*a)[0], args
    raise ValueError(f"unknown op {op!r}; choose simple_gla, gla, gsa, fox or gated_delta")


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


def gsa_registers(shape, target=(90, 32)):
    """Registers and stack (spill) bytes of GSA's per-chunk kernels, both anchor variants, at a
    shape, bf16, compiled ahead of time for sm_90 by Triton's bundled ptxas: needs no GPU. For the
    kernels before the launch split its stack bytes / 4 matched the spills read on the H100 (34-82)."""
    import re
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from t2r.ops.gsa import triton_chunk as tc
    from t2r.ops.gsa import triton_intra as ti

    B, T, HQ, H, D = shape
    const = dict(cu_seqlens=None, chunk_indices=None, HQ=HQ, H=H, K=D, V=D, M=SLOTS, BT=tc.BT, BS=tc.BS, BK=D,
                 BV=D, BM=SLOTS, BC=min(D, tc.COLUMNS), IS_VARLEN=False)
    fp32 = {"z", "r", "ds1", "dB"}
    lines = [f"### GSA per-chunk kernels, sm_{target[0]}, B,T,HQ,H,D = {','.join(map(str, shape))}", "",
             "| kernel | variant | warps, stages | registers | stack bytes |", "|---|---|---|---|---|"]
    for name in ("fwd_o", "bwd_dp", "bwd_dqk", "bwd_dvs"):
        fn = getattr(ti, f"_{name}_kernel")
        w, st = tc.CONFIGS_D64[name] if D <= 64 else tc.CONFIGS[name]
        for one in (True, False):
            sig, cst, attrs = {}, {}, {}
            for i, prm in enumerate(fn.params):
                n = prm.name
                if n in const or n == "ONE":
                    sig[n], cst[(i,)] = "constexpr", one if n == "ONE" else const[n]
                    continue
                sig[n] = {"scale": "fp32", "T": "i32", "NBH": "i32", "flags": "*i8", "steep": "*i32"}.get(
                    n, "*fp32" if n in fp32 else "*bf16")
                if n != "scale":   # pointers 16-byte aligned, T and NBH multiples of 16, as at launch
                    attrs[(i,)] = [["tt.divisibility", 16]]
            k = triton.compile(ASTSource(fn, sig, cst, attrs), target=GPUTarget("cuda", *target),
                               options=dict(num_warps=w, num_stages=st))
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(k.asm["cubin"])
                f.flush()
                tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
                use = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
            regs, stack = re.search(r"REG:(\d+)", use).group(1), re.search(r"STACK:(\d+)", use).group(1)
            lines.append(f"| _{name}_kernel | {'one anchor' if one else 'sub-blocks'} | {w}, {st} | {regs} | {stack} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", nargs="+", default=["simple_gla", "gla", "gsa", "fox"])
    ap.add_argument("--shape", default="4,4096,32,8,128", help="B,T,HQ,H,D")
    ap.add_argument("--gsa-regs", action="store_true", help="only print gsa_registers at the shape (no GPU)")
    args = ap.parse_args()
    shape = tuple(int(x) for x in args.shape.split(","))
    if args.gsa_regs:
        print(gsa_registers(shape))
        return
    for op in args.ops:
        print(profile(op, shape), flush=True)


if __name__ == "__main__":
    main()
