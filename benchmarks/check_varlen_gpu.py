"""GPU probe: the Triton kernels with packed sequences (cu_seqlens, as training's flattened batches call them)
against per-sequence PyTorch fp32 references, forward and backward, bf16, at SmolLM2's layer shape."""
import torch
import torch.nn.functional as F

from t2r.ops import gla, gsa, simple_gla

torch.manual_seed(0)
dev, B, HQ, H, K, V, M = "cuda", 1, 9, 3, 64, 64, 64
bounds = [0, 700, 2048, 3001, 4096]
T, cu = bounds[-1], torch.tensor(bounds, device=dev)


def inputs(name):
    q, k, v = torch.randn(B, T, HQ, K), torch.randn(B, T, H, K), torch.randn(B, T, H, V)
    if name == "gla":
        extra = [F.logsigmoid(torch.randn(B, T, H, K)) / 16]
    elif name == "simple_gla":
        extra = [F.logsigmoid(torch.randn(B, T, H)) / 16]
    else:
        g = F.logsigmoid(torch.randn(B, T, H, M)) / 8
        extra = [1 - g.exp(), g]
    return [t.to(dev) for t in (q, k, v, *extra)]


def run(fn, tensors, dtype, **kw):
    leaves = [t.detach().to(dtype).requires_grad_() for t in tensors]
    o, _ = fn(*leaves, **kw)
    o.float().pow(2).sum().backward()
    return [o.float()] + [t.grad.float() for t in leaves]


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


for name, fn in (("gla", gla), ("simple_gla", simple_gla), ("gsa", gsa)):
    x = inputs(name)
    packed = run(fn, x, torch.bfloat16, cu_seqlens=cu)
    rows = [run(fn, [t[:, a:b] for t in x], torch.float32) for a, b in zip(bounds[:-1], bounds[1:])]
    with torch.no_grad():
        nograd = fn(*[t.to(torch.bfloat16) for t in x], cu_seqlens=cu)[0].float()
    ref = [torch.cat([r[i] for r in rows], 1) for i in range(len(rows[0]))]
    separate = [run(fn, [t[:, a:b] for t in x], torch.bfloat16) for a, b in zip(bounds[:-1], bounds[1:])]
    sep = [torch.cat([r[i] for r in separate], 1) for i in range(len(rows[0]))]
    names = ["o"] + [f"d{i}" for i in range(len(x))]
    print(name, "packed bf16 vs fp32 ref:", {n: round(rel(a, b), 4) for n, a, b in zip(names, packed, ref)})
    print(name, "separate bf16 vs fp32 ref:", {n: round(rel(a, b), 4) for n, a, b in zip(names, sep, ref)})
    print(name, "no_grad packed o vs ref:", round(rel(nograd, ref[0]), 4), flush=True)
