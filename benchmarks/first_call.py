"""Cold first-call seconds of what a staged SmolLM2 -> GSA + window 64 + 4 sinks step compiles (issue 30): the GSA
chunk kernels forward+backward and the FlexAttention window, each timed alone in this process, at the SmolLM2
layer shape of one micro-batch (8 x 2048, 9 query / 3 kv heads, head dim 64, 64 slots), bf16. Run with an empty
Triton / Inductor cache to see a fresh machine's cost:

    rm -rf ~/.triton/cache /tmp/torchinductor_$USER; python benchmarks/first_call.py
"""

import time

import torch
import torch.nn.functional as F

from t2r.ops.gsa import gsa
from t2r.ops.window.flex import flex_window_attention


def timed(name, fn):
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    first = time.perf_counter() - start
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    print(f"| {name} | {first:.1f} | {1000 * (time.perf_counter() - start):.1f} |", flush=True)


def main(B=8, T=2048, HQ=9, H=3, D=64, M=64):
    dev, dt = "cuda", torch.bfloat16
    print(f"### first call vs second, {torch.cuda.get_device_name()}, B={B} T={T} HQ={HQ} H={H} D={D} M={M}\n")
    print("| op | first call s | second call ms |\n|---|---|---|")
    q = torch.randn(B, T, HQ, D, device=dev, dtype=dt, requires_grad=True)
    k, v = (torch.randn(B, T, H, D, device=dev, dtype=dt, requires_grad=True) for _ in range(2))
    g = (F.logsigmoid(torch.randn(B, T, H, M, device=dev)) / 8)
    s, g = (t.to(dt).requires_grad_(True) for t in (-g.expm1(), g))

    def gsa_step():
        o = gsa(q, k, v, s, g)[0]
        o.float().sum().backward()

    timed("gsa chunk fwd+bwd", gsa_step)
    positions = torch.arange(T, device=dev).expand(B, T)

    def window_step():
        o = flex_window_attention(q, k, v, positions=positions, window=64, sinks=4, scale=D ** -0.5)
        o.float().sum().backward()

    timed("flex window 64 + 4 sinks fwd+bwd", window_step)


if __name__ == "__main__":
    main()
