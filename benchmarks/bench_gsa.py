"""Gated slot attention: t2r Triton kernels vs PyTorch SDPA (flash, causal, GQA) vs fla.

    python benchmarks/bench_gsa.py                 # tables, writes benchmarks/results/gsa_<device>.md
    python benchmarks/bench_gsa.py --sweep         # also gradient-check and time candidate configs
    python benchmarks/bench_gsa.py --out DIR       # write the markdown under DIR instead
    python benchmarks/bench_gsa.py --fla-chunk     # also time fla chunk_gsa at the Mistral shape (minutes of autotune)

bf16, median of triton.testing.do_bench (CUDA events). 64 slots, s = 1 - exp(g) with
g = logsigmoid(x) / 8 (the GSA layer's parameterisation). "fwd+bwd" = forward plus backward
of o with a random cotangent. SDPA sees q, k, v laid out [B, H, T, D]; the others [B, T, H, D].
fla's chunk_gsa / fused_recurrent_gsa get the GQA tensors as they are (falling back to
repeated kv heads if they refuse).  "first call" is compile time with an empty Triton cache.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="t2r_gsa_cache_"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from t2r.ops.gsa import triton_chunk as tc  # noqa: E402
from t2r.ops.gsa.naive import naive_recurrent_gsa  # noqa: E402
from t2r.ops.gsa.triton_recurrent import fused_recurrent_gsa_triton  # noqa: E402

try:
    from fla.ops.gsa import chunk_gsa as fla_chunk_gsa
    from fla.ops.gsa import fused_recurrent_gsa as fla_recurrent_gsa
except Exception as e:  # noqa: BLE001
    print(f"fla not importable ({type(e).__name__}: {e}); fla columns skipped")
    fla_chunk_gsa = fla_recurrent_gsa = None

DEV, DT, M = "cuda", torch.bfloat16, 64
SHAPES = [  # name, B, T, HQ, H, D
    ("Mistral B4 T4K HQ32 H8 D128", 4, 4096, 32, 8, 128),
    ("SmolLM2 B32 T2K HQ9 H3 D64", 32, 2048, 9, 3, 64),
]
SWEEP = [  # overrides of tc.CONFIGS (D=128 pins; both launches of a per-chunk kernel take its config)
    {},
    {"fwd_o": (4, 2), "bwd_dp": (4, 2)},
    {"fwd_o": (4, 4), "bwd_dp": (4, 4)},
    {"bwd_dqk": (4, 2), "bwd_dvs": (4, 2)},
    {"bwd_dqk": (4, 2)},
    {"bwd_dvs": (4, 2)},
    {"bwd_dqk": (8, 1), "bwd_dvs": (8, 1)},
]


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def make(B, T, HQ, H, D, grad=True):
    q = torch.randn(B, T, HQ, D, device=DEV, dtype=DT)
    k = torch.randn(B, T, H, D, device=DEV, dtype=DT)
    v = torch.randn(B, T, H, D, device=DEV, dtype=DT)
    g = F.logsigmoid(torch.randn(B, T, H, M, device=DEV)) / 8
    s = (-g.expm1()).to(DT)
    g = g.to(DT)
    return [t.requires_grad_(grad) for t in (q, k, v, s, g)]


def fwd_and_fwdbwd(fn, args):
    do = torch.randn_like(fn(*args)[0])

    def fwd():
        with torch.no_grad():
            fn(*args)

    def fwdbwd():   # gradients returned, not accumulated into .grad (as bench_linear_ops.py)
        o = fn(*args)[0]
        torch.autograd.grad(o, [a for a in args if a.requires_grad], do)
    return bench(fwd), bench(fwdbwd)


def first_call(fn, args):
    torch.cuda.synchronize()
    t0 = time.time()
    o = fn(*args)[0]
    torch.cuda.synchronize()
    t1 = time.time()
    o.backward(torch.randn_like(o))
    torch.cuda.synchronize()
    return t1 - t0, time.time() - t1


def ours(q, k, v, s, g):
    return tc.chunk_gsa_triton(q, k, v, s, g)


def sdpa(q, k, v):
    return (F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),)


def fla_chunk(q, k, v, s, g):
    return fla_chunk_gsa(q, k, v, s, g)


def grad_check(B=1, T=300, HQ=8, H=2, D=128):
    """Max relative error over o and all gradients vs the fp32 naive reference."""
    torch.manual_seed(0)
    args = make(B, T, HQ, H, D)
    args[3] = (torch.rand_like(args[3].float()) * 2).to(DT).requires_grad_(True)   # s independent of g
    ref_in = [a.detach().float().requires_grad_(True) for a in args]
    do = torch.randn(B, T, HQ, D, device=DEV)
    o = ours(*args)[0]
    o.backward(do.to(DT))
    r = naive_recurrent_gsa(*ref_in)[0]
    r.backward(do)
    errs = [((o.float() - r).norm() / r.norm()).item()]
    errs += [((a.grad.float() - b.grad).norm() / b.grad.norm()).item() for a, b in zip(args, ref_in)]
    return max(errs), errs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--fla-chunk", action="store_true",
                    help="also time fla chunk_gsa (its autotune takes minutes on first call)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = ap.parse_args()
    dev_name = torch.cuda.get_device_name()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"gsa_{dev_name.lower().replace('nvidia ', '').split()[0]}.md")

    def save():  # after every row: a run cut by a time limit keeps what it measured
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")

    lines = [f"# GSA kernels on {dev_name}", "",
             f"torch {torch.__version__}, triton {triton.__version__}; bf16, M = {M} slots, "
             "median of do_bench; command: `python benchmarks/bench_gsa.py" + (" --sweep" if args.sweep else "") + "`",
             ""]

    # first call (compile) on the small shape, empty cache
    fc = first_call(ours, make(1, 256, 8, 2, 128))
    fc64 = first_call(ours, make(1, 256, 6, 3, 64))
    lines.append(f"First call (empty Triton cache): D128 fwd {fc[0]:.1f} s, bwd {fc[1]:.1f} s; "
                 f"D64 fwd {fc64[0]:.1f} s, bwd {fc64[1]:.1f} s")
    err, errs = grad_check()
    lines.append(f"Gradient check of the shipped configs (bf16 vs fp32 naive, B1 T300 HQ8 H2 D128): "
                 f"max rel err {err:.2e} (o, dq, dk, dv, ds, dg = {', '.join(f'{e:.1e}' for e in errs)})")
    lines.append("")
    print("\n".join(lines), flush=True)
    save()

    if args.sweep:
        base = dict(tc.CONFIGS)
        lines += ["## Config sweep (Mistral shape)", "", "| overrides | max rel err | fwd ms | fwd+bwd ms |",
                  "|---|---|---|---|"]
        for ov in SWEEP:
            tc.CONFIGS.clear()
            tc.CONFIGS.update({**base, **ov})
            err, _ = grad_check()
            f, fb = fwd_and_fwdbwd(ours, make(4, 4096, 32, 8, 128))
            lines.append(f"| {ov or 'shipped'} | {err:.2e} | {f:.3f} | {fb:.3f} |")
            print(lines[-1], flush=True)
            save()
        tc.CONFIGS.clear()
        tc.CONFIGS.update(base)
        lines.append("")

    lines += ["## Training shapes (fwd / fwd+bwd, ms)", "",
              "| shape | t2r triton | SDPA flash causal GQA | fla chunk_gsa |", "|---|---|---|---|"]
    for name, B, T, HQ, H, D in SHAPES:
        a = make(B, T, HQ, H, D)
        f, fb = fwd_and_fwdbwd(ours, a)
        qs = torch.randn(B, HQ, T, D, device=DEV, dtype=DT, requires_grad=True)
        ks = torch.randn(B, H, T, D, device=DEV, dtype=DT, requires_grad=True)
        vs = torch.randn(B, H, T, D, device=DEV, dtype=DT, requires_grad=True)
        sf, sfb = fwd_and_fwdbwd(sdpa, (qs, ks, vs))
        fla_col = "-"
        if fla_chunk_gsa is not None and args.fla_chunk and name.startswith("Mistral"):
            try:
                ff, ffb = fwd_and_fwdbwd(fla_chunk, a)
                fla_col = f"{ff:.3f} / {ffb:.3f}"
            except Exception as e:  # noqa: BLE001
                fla_col = f"failed ({type(e).__name__})"
        lines.append(f"| {name} | {f:.3f} / {fb:.3f} | {sf:.3f} / {sfb:.3f} | {fla_col} |")
        print(lines[-1], flush=True)
        save()
        del a, qs, ks, vs
        torch.cuda.empty_cache()

    lines += ["", "## Decode, one token, batch 64 (ms)", "",
              "| shape | t2r fused_recurrent (state in/out) | fla fused_recurrent_gsa | SDPA, 2K KV cache |",
              "|---|---|---|---|"]
    for name, _, _, HQ, H, D in SHAPES:
        B = 64
        q, k, v, s, g = make(B, 1, HQ, H, D, grad=False)
        st = (torch.randn(B, H, D, M, device=DEV), torch.randn(B, H, M, D, device=DEV))
        t_ours = bench(lambda: fused_recurrent_gsa_triton(q, k, v, s, g, initial_state=st, output_final_state=True))
        t_fla = "-"
        if fla_recurrent_gsa is not None:
            try:
                t_fla = "%.4f" % bench(lambda: fla_recurrent_gsa(q, k, v, s, g, initial_state=st,
                                                                 output_final_state=True))
            except Exception as e:  # noqa: BLE001
                t_fla = f"failed ({type(e).__name__}: {str(e)[:60]})"
        qd = torch.randn(B, HQ, 1, D, device=DEV, dtype=DT)
        kc = torch.randn(B, H, 2048, D, device=DEV, dtype=DT)
        vc = torch.randn(B, H, 2048, D, device=DEV, dtype=DT)
        t_sdpa = bench(lambda: F.scaled_dot_product_attention(qd, kc, vc, enable_gqa=True))
        lines.append(f"| {name.split(' B')[0]} HQ{HQ} H{H} D{D} | {t_ours:.4f} | {t_fla} | {t_sdpa:.4f} |")
        print(lines[-1], flush=True)
        save()

    print("\n".join(lines))
    save()
    print("wrote", path)


if __name__ == "__main__":
    main()
