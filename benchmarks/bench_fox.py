"""Forgetting attention: Triton kernel vs PyTorch SDPA (flash, causal, GQA) vs fla.

    python benchmarks/bench_fox.py                 # table at the three shapes
    python benchmarks/bench_fox.py --sweep         # also time candidate kernel configs
    python benchmarks/bench_fox.py --out DIR       # also write DIR/fox_<device>.md

bf16, median of triton.testing.do_bench (CUDA events).  Gates are logsigmoid(randn),
cumulated in fp32.  "fwd+bwd" is forward plus backward of o with a random cotangent.
TFLOP/s counts causal attention only (fwd 2 matmuls, bwd 5, over half the T x T square).
SDPA sees q, k, v already laid out [B, H, T, D]; ours and fla take [B, T, H, D].
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from t2r.ops.fox import triton_parallel as tp  # noqa: E402

SHAPES = [  # name, B, T, HQ, H, D
    ("main B4 T4K HQ32 H8 D128", 4, 4096, 32, 8, 128),
    ("SmolLM2 B32 T2K HQ9 H3 D64", 32, 2048, 9, 3, 64),
    ("SmolLM2 B2 T32K HQ9 H3 D64", 2, 32768, 9, 3, 64),
]

# candidates for --sweep: (BM, BN, num_warps, num_stages); "fused" = dkv kernel also adds dq
# (1: fp32 atomics, 2: TMA reduce-add), no dq kernel
SWEEP = {
    128: dict(
        fwd=[(128, 128, 8, 3), (128, 64, 8, 3)],
        dkv=[(64, 128, 8, 2), (64, 64, 8, 2), (64, 64, 8, 3), (32, 128, 8, 2), (32, 64, 4, 3), (128, 64, 8, 2)],
        dq=[(128, 128, 8, 2), (128, 64, 8, 2), (64, 128, 8, 2), (64, 64, 8, 3), (128, 64, 8, 3)],
        fused=[((64, 128, 8, 2), 2), ((64, 64, 8, 2), 2)],
    ),
    64: dict(
        fwd=[(128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 3)],
        dkv=[(32, 128, 4, 3), (64, 64, 4, 3), (64, 64, 8, 3), (64, 128, 8, 2)],
        dq=[(128, 32, 4, 3), (128, 64, 4, 3), (64, 64, 4, 3), (64, 64, 8, 3)],
        fused=[((64, 128, 8, 2), 2), ((64, 64, 4, 2), 2)],
    ),
}


def bench(fn, grads=()):
    return triton.testing.do_bench(fn, warmup=25, rep=100, grad_to_none=list(grads), return_mode="median")


def inputs(B, T, HQ, H, D, seed=0):
    torch.manual_seed(seed)
    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(B, T, HQ, D, device=dev, dtype=dt, requires_grad=True)
    k = torch.randn(B, T, H, D, device=dev, dtype=dt, requires_grad=True)
    v = torch.randn(B, T, H, D, device=dev, dtype=dt, requires_grad=True)
    g = F.logsigmoid(torch.randn(B, T, HQ, device=dev, dtype=torch.float32)).requires_grad_(True)
    do = torch.randn(B, T, HQ, D, device=dev, dtype=dt)
    return q, k, v, g, do


def time_pair(f, args, do):
    """(fwd ms, fwd+bwd ms, first call s)."""
    t0 = time.perf_counter()
    f(*args).backward(do)
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    with torch.no_grad():
        fwd = bench(lambda: f(*args))

    def fb():
        f(*args).backward(do)

    return fwd, bench(fb, args), first


def ours(q, k, v, g):
    return tp.parallel_forgetting_attention_triton(q, k, v, g)


def sdpa_fn():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def f(q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    return f


def sdpa_auto_fn():
    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    return f


def fla_fn():
    try:
        from fla.ops.forgetting_attn import parallel_forgetting_attn
    except Exception as e:  # noqa: BLE001
        print(f"fla not importable: {e!r}")
        return None
    return lambda q, k, v, g: parallel_forgetting_attn(q, k, v, g)


def flops(B, T, HQ, D):
    return 4 * B * HQ * D * T * T / 2  # fwd, causal


def sweep(D, B, T, HQ, H):
    """Time each candidate kernel config (others at the default); grad-check each on a ragged GQA shape."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "ops"))
    import test_triton_fox as tt

    base = dict(tp._config(D))
    q, k, v, g, do = inputs(B, T, HQ, H, D, seed=1)
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    scale = D ** -0.5
    cq, ck = tp._prep_c(g.detach(), None)
    o, rowb = tp._fwd(qd, kd, vd, cq, ck, scale, None, base)
    delta = tp._delta(o, do)
    rows = []
    for kind, cands in SWEEP[D].items():
        for cand in cands:
            if kind == "fused":
                cfg = dict(base, dkv=cand[0], fuse_dq=cand[1])
            else:
                cfg = dict(base, **{kind: cand})
            tp.CONFIG_OVERRIDE = cfg
            try:
                ok = "ok"
                try:
                    tt.check((2, 777, 777, 8, 2, D, D), torch.bfloat16, 2e-2, seed=3)
                except AssertionError as e:
                    ok = f"WRONG: {str(e)[:70]}"
                if kind == "fwd":
                    ms = bench(lambda: tp._fwd(qd, kd, vd, cq, ck, scale, None, cfg))
                elif kind == "dkv":
                    ms = bench(lambda: tp._dkv(do, qd, kd, vd, ck, rowb, delta, scale, None, None, cfg))
                elif kind == "dq":
                    ms = bench(lambda: tp._dq(do, qd, kd, vd, ck, rowb, delta, scale, None, cfg))
                else:  # whole backward
                    ms = bench(lambda: tp._bwd(do, qd, kd, vd, o, ck, rowb, scale, None, None, cfg))
                kn = tp.LAST_KERNEL.get("dkv" if kind == "fused" else kind)
                regs = f"{getattr(kn, 'n_regs', '?')}/{getattr(kn, 'n_spills', '?')}"
                rows.append((kind, cand, ms, regs, ok))
            except Exception as e:  # noqa: BLE001 (compile failures, out of resources)
                rows.append((kind, cand, float("nan"), "", f"FAILED {type(e).__name__}: {str(e)[:70]}"))
            print(f"  sweep D={D} {kind} {cand}: {rows[-1][2]:.3f} ms regs/spills {rows[-1][3]} {rows[-1][4]}",
                  flush=True)
    tp.CONFIG_OVERRIDE = None
    # the default backward as a whole, for comparison with the fused rows
    ms = bench(lambda: tp._bwd(do, qd, kd, vd, o, ck, rowb, scale, None, None, base))
    rows.append(("bwd default", (base["dkv"], base["dq"]), ms, "", ""))
    print(f"  sweep D={D} default bwd: {ms:.3f} ms", flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--shapes", default="0,1,2")
    ap.add_argument("--sweep-dims", default="128,64", help="head dims to sweep")
    args = ap.parse_args()

    dev = torch.cuda.get_device_name()
    lines = [f"# Forgetting attention, {dev}", "",
             f"torch {torch.__version__}, triton {triton.__version__}; bf16; median ms (do_bench); "
             "command: `python benchmarks/bench_fox.py" + (" --sweep" if args.sweep else "") + "`", ""]

    if args.sweep:
        lines += ["## Config sweep (one kernel alone; fused / default bwd = delta + dkv (+ dq) + dg cumsum)", "",
                  "D=128 at B4 T4K HQ32 H8, D=64 at B32 T2K HQ9 H3.", "",
                  "| D | kernel | (BM, BN, warps, stages) | ms | regs/spills | grad check |",
                  "|---|---|---|---|---|---|"]
        sweep_shapes = {128: (4, 4096, 32, 8), 64: (32, 2048, 9, 3)}
        for D in map(int, args.sweep_dims.split(",")):
            B, T, HQ, H = sweep_shapes[D]
            for kind, cfg, ms, regs, ok in sweep(D, B, T, HQ, H):
                lines.append(f"| {D} | {kind} | {cfg} | {ms:.3f} | {regs} | {ok} |")
        lines.append("")

    sdpa = sdpa_fn()
    fla = fla_fn()
    lines += ["## Forward and forward+backward", "",
              "| shape | impl | fwd ms | fwd+bwd ms | fwd TFLOP/s | fwd+bwd TFLOP/s | first call s |",
              "|---|---|---|---|---|---|---|"]
    for idx in map(int, args.shapes.split(",")):
        name, B, T, HQ, H, D = SHAPES[idx]
        q, k, v, g, do = inputs(B, T, HQ, H, D)
        fl = flops(B, T, HQ, D)
        impls = [("ours (triton)", ours, (q, k, v, g), do)]
        qt = q.detach().transpose(1, 2).contiguous().requires_grad_(True)
        kt = k.detach().transpose(1, 2).contiguous().requires_grad_(True)
        vt = v.detach().transpose(1, 2).contiguous().requires_grad_(True)
        dot = do.transpose(1, 2).contiguous()
        impls.append(("SDPA flash causal", sdpa, (qt, kt, vt), dot))
        impls.append(("SDPA default backend", sdpa_auto_fn(), (qt, kt, vt), dot))
        if fla is not None:
            impls.append(("fla parallel_forgetting_attn", fla, (q, k, v, g), do))
        for iname, f, a, d in impls:
            try:
                fwd, fb, first = time_pair(f, a, d)
                row = (f"| {name} | {iname} | {fwd:.3f} | {fb:.3f} | {fl / fwd / 1e9:.0f} | {3.5 * fl / fb / 1e9:.0f} "
                       f"| {first:.1f} |")
            except Exception as e:  # noqa: BLE001
                row = f"| {name} | {iname} | failed: {type(e).__name__}: {str(e)[:60]} | | | | |"
            lines.append(row)
            print(row, flush=True)
            for t in a:
                t.grad = None
        del q, k, v, g, do, qt, kt, vt
        torch.cuda.empty_cache()

    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        slug = "h100" if "H100" in dev else ("h200" if "H200" in dev else dev.replace(" ", "_").lower())
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"fox_{slug}.md"), "w") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
