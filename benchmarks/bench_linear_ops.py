"""Time t2r's Triton linear-attention kernels against SDPA (flash) and fla, bf16, on one GPU.

    python benchmarks/bench_linear_ops.py            # full tables, writes benchmarks/results/linear_ops_<device>.md
    python benchmarks/bench_linear_ops.py --quick    # Mistral shape only
    python benchmarks/bench_linear_ops.py --sweep    # also time (num_warps, num_stages) per kernel
    python benchmarks/bench_linear_ops.py --smoke    # CPU: the gated delta rows at a tiny shape (Triton interpreter)

Forward and forward+backward medians from triton.testing.do_bench (CUDA events).
Ops: retention (simple_gla), GLA, GSA (64 slots), forgetting attention and the gated delta rule, all with GQA,
against SDPA.
Shapes: Mistral-7B layer (B=4, T=4096, HQ=32, H=8, D=128), SmolLM2-135M (B=32, T=2048, HQ=9,
H=3, D=64), a T-scaling table at 128K tokens per batch, and one decode step at batch 64.
fla (if importable) runs chunk_gla / chunk_simple_gla without GQA (k, v, g repeated to HQ heads), as its
chunk kernels need, and parallel_forgetting_attn with GQA; its chunk_gsa is in bench_gsa.py --fla-chunk
(minutes of autotuning per shape). fla's chunk_gated_delta_rule and fused_recurrent_gated_delta_rule run with
k, v, g, beta (and the decode state) repeated to HQ heads: their grouping is the other way round (more value
heads than query/key heads), not GQA.
"""
import argparse
import os
import sys
import time

if "--smoke" in sys.argv:   # must precede the first import of triton
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from t2r.ops.common import triton_chunk as tc  # noqa: E402
from t2r.ops.fox.triton_parallel import parallel_forgetting_attention_triton  # noqa: E402
from t2r.ops.gated_delta.triton_chunk import chunk_gated_delta_rule_triton  # noqa: E402
from t2r.ops.gated_delta.triton_recurrent import fused_recurrent_gated_delta_rule_triton  # noqa: E402
from t2r.ops.gla.triton_chunk import chunk_gla_triton  # noqa: E402
from t2r.ops.gla.triton_recurrent import fused_recurrent_gla_triton  # noqa: E402
from t2r.ops.gsa.triton_chunk import chunk_gsa_triton  # noqa: E402
from t2r.ops.simple_gla.triton_chunk import chunk_simple_gla_triton  # noqa: E402
from t2r.ops.simple_gla.triton_recurrent import fused_recurrent_simple_gla_triton  # noqa: E402

try:
    from fla.ops.gla import chunk_gla as fla_chunk_gla
    from fla.ops.simple_gla import chunk_simple_gla as fla_chunk_simple_gla
except Exception as e:  # noqa: BLE001
    print(f"fla not importable ({type(e).__name__}: {e}); fla columns skipped")
    fla_chunk_gla = fla_chunk_simple_gla = None
try:
    from fla.ops.forgetting_attn import parallel_forgetting_attn as fla_forgetting_attn
except Exception:  # noqa: BLE001
    fla_forgetting_attn = None
try:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk_gated_delta
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fla_recurrent_gated_delta
except Exception:  # noqa: BLE001
    fla_chunk_gated_delta = fla_recurrent_gated_delta = None

DEV = "cuda"
DT = torch.bfloat16


def bench(fn, warmup=25, rep=100):
    if DEV == "cpu":   # --smoke: one timed call, no CUDA events
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def inputs(B, T, HQ, H, D, scalar, heads_for_kv=None):
    Hk = heads_for_kv or H
    q = torch.randn(B, T, HQ, D, device=DEV, dtype=DT)
    k = torch.randn(B, T, Hk, D, device=DEV, dtype=DT)
    v = torch.randn(B, T, Hk, D, device=DEV, dtype=DT)
    gshape = (B, T, Hk) if scalar else (B, T, Hk, D)
    g = (F.logsigmoid(torch.randn(gshape, device=DEV)) / 16).to(DT)
    return [t.requires_grad_(True) for t in (q, k, v, g)]


def gsa_gates(B, T, H, M=64):
    """GSA's slot gates as its layer makes them: g = logsigmoid(x) / 8, s = 1 - exp(g)."""
    g = F.logsigmoid(torch.randn(B, T, H, M, device=DEV)) / 8
    return [t.to(DT).requires_grad_(True) for t in (-g.expm1(), g)]


def gated_delta_inputs(B, T, HQ, H, D):
    """q, unit-norm k, v, log decay g = logsigmoid(randn) (about -0.8 per step) and beta = sigmoid(randn),
    kv tensors on H heads (H = HQ for fla, which has no GQA)."""
    q = torch.randn(B, T, HQ, D, device=DEV, dtype=DT)
    k = F.normalize(torch.randn(B, T, H, D, device=DEV), dim=-1).to(DT)
    v = torch.randn(B, T, H, D, device=DEV, dtype=DT)
    g = F.logsigmoid(torch.randn(B, T, H, device=DEV))
    beta = torch.randn(B, T, H, device=DEV).sigmoid()
    return [t.requires_grad_(True) for t in (q, k, v, g, beta)]


def gated_delta_rows(B, T, HQ, H, D, with_fla=True):
    """Ours (GQA) and fla's chunk_gated_delta_rule (kv repeated to HQ heads): fwd, fwd+bwd, first call."""
    do = torch.randn(B, T, HQ, D, device=DEV, dtype=DT)
    rows = [("t2r gated_delta (GQA)",) + time_op(lambda *x: chunk_gated_delta_rule_triton(*x),
                                                 gated_delta_inputs(B, T, HQ, H, D), do)]
    if with_fla and fla_chunk_gated_delta is not None:   # fla 0.5.2: (q, k, v, g, beta, scale=None, ...), [B,T,H,*]
        rows.append(try_time_op(f"fla chunk_gated_delta_rule ({HQ} heads)", lambda *x: fla_chunk_gated_delta(*x),
                                gated_delta_inputs(B, T, HQ, HQ, D), do))
    return rows


def gated_delta_decode_rows(B=64, HQ=32, H=8, D=128, with_fla=True):
    """One decode step: ours (state on H kv heads) and fla's fused_recurrent (state repeated to HQ heads)."""
    rows = []
    with torch.no_grad():
        q, k, v, g, beta = (t.detach()[:, :1].contiguous() for t in gated_delta_inputs(B, 1, HQ, H, D))
        s0 = torch.randn(B, H, D, D, device=DEV)
        t0 = time.time()
        fused_recurrent_gated_delta_rule_triton(q, k, v, g, beta, initial_state=s0, output_final_state=True)
        sync()
        first = time.time() - t0
        t = bench(lambda: fused_recurrent_gated_delta_rule_triton(q, k, v, g, beta, initial_state=s0,
                                                                  output_final_state=True))
        rows.append((f"t2r recurrent gated_delta step (first call {first:.1f} s)", t))
        if with_fla and fla_recurrent_gated_delta is not None:
            G = HQ // H
            kr, vr, gr, br = (x.repeat_interleave(G, dim=2) for x in (k, v, g, beta))
            sr = s0.repeat_interleave(G, dim=1)
            try:
                t = bench(lambda: fla_recurrent_gated_delta(q, kr, vr, gr, beta=br, initial_state=sr,
                                                            output_final_state=True))
                rows.append((f"fla fused_recurrent_gated_delta_rule ({HQ} heads)", t))
            except Exception as e:  # noqa: BLE001
                rows.append((f"fla fused_recurrent_gated_delta_rule ({error_text(e)})", float("nan")))
    return rows


def fox_gates(B, T, HQ):
    """Forgetting attention's log forget gates, one per query head, fp32 (as the layer and bench_fox.py)."""
    return F.logsigmoid(torch.randn(B, T, HQ, device=DEV)).requires_grad_(True)


def time_op(fn, args, do):
    def fwd():
        with torch.no_grad():
            fn(*args)

    def fwdbwd():
        o = fn(*args)
        o = o[0] if isinstance(o, tuple) else o
        torch.autograd.grad(o, [a for a in args if a.requires_grad], do)

    t0 = time.time()
    fwdbwd()
    sync()
    first = time.time() - t0
    return bench(fwd), bench(fwdbwd), first


def error_text(e: Exception) -> str:
    """`Type: first line of the message`, at most 80 characters, for a table cell."""
    lines = str(e).splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:80].replace("|", "/")


def try_time_op(label, fn, args, do):
    """time_op's row for another library's op, which may refuse: when fwd+bwd raises, the forward is timed
    alone (fla 0.5.2 refuses its gated backward kernels on Hopper with triton < 3.7.1, fla #640) and the
    label carries the error, so the table says why a column is missing."""
    try:
        return (label,) + time_op(fn, args, do)
    except Exception as e:  # noqa: BLE001
        why = error_text(e)
    try:
        with torch.no_grad():
            fwd = bench(lambda: fn(*args))
        return (f"{label} (fwd+bwd: {why})", fwd, float("nan"), 0.)
    except Exception as e:  # noqa: BLE001
        return (f"{label} ({error_text(e)})", float("nan"), float("nan"), 0.)


def sdpa_fn(q, k, v):
    # [B,T,H,D] -> [B,H,T,D]
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       is_causal=True, enable_gqa=True)
    return o.transpose(1, 2)


def row_set(B, T, HQ, H, D, with_fla=True):
    rows = []
    do = torch.randn(B, T, HQ, D, device=DEV, dtype=DT)
    # ours
    a = inputs(B, T, HQ, H, D, scalar=True)
    rows.append(("t2r simple_gla (GQA)",) + time_op(lambda *x: chunk_simple_gla_triton(*x), a, do))
    a = inputs(B, T, HQ, H, D, scalar=False)
    rows.append(("t2r gla (GQA)",) + time_op(lambda *x: chunk_gla_triton(*x), a, do))
    q, k, v, _ = a
    s, gs = gsa_gates(B, T, H)
    rows.append(("t2r gsa (GQA, 64 slots)",) + time_op(lambda *x: chunk_gsa_triton(*x), [q, k, v, s, gs], do))
    g_fox = fox_gates(B, T, HQ)
    rows.append(("t2r forgetting attention (GQA)",)
                + time_op(lambda *x: parallel_forgetting_attention_triton(*x), [q, k, v, g_fox], do))
    rows.append(("SDPA causal flash (GQA)",) + time_op(sdpa_fn, [q, k, v], do))
    if with_fla and fla_forgetting_attn is not None:
        rows.append(try_time_op("fla parallel_forgetting_attn (GQA)", lambda *x: fla_forgetting_attn(*x),
                                [q, k, v, g_fox], do))
    del a, q, k, v, s, gs, g_fox
    rows += gated_delta_rows(B, T, HQ, H, D, with_fla)
    if with_fla and fla_chunk_gla is not None:
        a = inputs(B, T, HQ, H, D, scalar=False, heads_for_kv=HQ)
        rows.append(try_time_op(f"fla chunk_gla ({HQ} heads)", lambda *x: fla_chunk_gla(*x), a, do))
        a = inputs(B, T, HQ, H, D, scalar=True, heads_for_kv=HQ)
        rows.append(try_time_op(f"fla chunk_simple_gla ({HQ} heads)", lambda *x: fla_chunk_simple_gla(*x), a, do))
        del a
    torch.cuda.empty_cache()
    return rows


def fmt_table(title, rows):
    out = [f"### {title}", "", "| op | forward ms | forward+backward ms | first call s |", "|---|---|---|---|"]
    for name, f, fb, first in rows:
        out.append(f"| {name} | {f:.3f} | {fb:.3f} | {first:.1f} |")
    return "\n".join(out) + "\n"


def decode_rows(B=64, HQ=32, H=8, D=128):
    rows = []
    q = torch.randn(B, 1, HQ, D, device=DEV, dtype=DT)
    k = torch.randn(B, 1, H, D, device=DEV, dtype=DT)
    v = torch.randn(B, 1, H, D, device=DEV, dtype=DT)
    gv = (F.logsigmoid(torch.randn(B, 1, H, D, device=DEV)) / 16)
    gs = gv[..., 0].contiguous()
    rows += recurrent_step_rows(q, k, v, gv, gs)
    rows += gated_delta_decode_rows(B, HQ, H, D)
    for L in (2048, 8192, 32768):
        rows.append(kv_cache_row(q, H, L))
        torch.cuda.empty_cache()
    return rows


def recurrent_step_rows(q, k, v, gv, gs):
    """One recurrent step of GLA and simple GLA from a random fp32 state (freed on return)."""
    B, _, H, D = k.shape
    s0 = torch.randn(B, H, D, D, device=DEV)
    fused_recurrent_gla_triton(q, k, v, gv, initial_state=s0, output_final_state=True)
    t_gla = bench(lambda: fused_recurrent_gla_triton(q, k, v, gv, initial_state=s0, output_final_state=True))
    t_simple = bench(lambda: fused_recurrent_simple_gla_triton(q, k, v, gs, initial_state=s0, output_final_state=True))
    return [("t2r recurrent gla step (fp32 state 32 MiB)", t_gla), ("t2r recurrent simple_gla step", t_simple)]


def kv_cache_row(q, H, L):
    """One decode step of SDPA over a KV cache of L tokens (freed on return)."""
    B, _, _, D = q.shape
    kc = torch.randn(B, H, L, D, device=DEV, dtype=DT)
    vc = torch.randn(B, H, L, D, device=DEV, dtype=DT)
    qt = q.transpose(1, 2)
    t = bench(lambda: F.scaled_dot_product_attention(qt, kc, vc, enable_gqa=True))
    return (f"SDPA over KV cache {L // 1024}K ({2 * kc.numel() * 2 / 2**30:.1f} GiB)", t)


def scaling_table(tokens=131072, HQ=32, H=8, D=128):
    """fwd+bwd time per 1K tokens at a constant batch of `tokens` tokens, T = 2K ... 128K."""
    lines = [f"### T scaling at {tokens // 1024}K tokens per batch, Mistral heads (fwd+bwd ms per 1K tokens)", "",
             "| B x T | t2r simple_gla | t2r gla | t2r gsa (64 slots) | t2r gated_delta | SDPA causal flash |",
             "|---|---|---|---|---|---|"]
    for T in (2048, 8192, 32768, 131072):
        B = tokens // T
        do = torch.randn(B, T, HQ, D, device=DEV, dtype=DT)
        a = inputs(B, T, HQ, H, D, scalar=True)
        ms = [time_op(lambda *x: chunk_simple_gla_triton(*x), a, do)[1]]
        a = inputs(B, T, HQ, H, D, scalar=False)
        ms.append(time_op(lambda *x: chunk_gla_triton(*x), a, do)[1])
        q, k, v, g = a
        sg = gsa_gates(B, T, H)
        ms.append(time_op(lambda q, k, v, s, g: chunk_gsa_triton(q, k, v, s, g), [q, k, v, *sg], do)[1])
        ms.append(time_op(lambda *x: chunk_gated_delta_rule_triton(*x), gated_delta_inputs(B, T, HQ, H, D), do)[1])
        ms.append(time_op(sdpa_fn, [q, k, v], do)[1])
        lines.append(f"| {B} x {T // 1024}K | " + " | ".join(f"{t * 1024 / (B * T):.4f}" for t in ms) + " |")
        del a, q, k, v, g, sg, do
        torch.cuda.empty_cache()
    return "\n".join(lines) + "\n"


def sweep(B=4, T=4096, HQ=32, H=8, D=128):
    """Time each kernel's (num_warps, num_stages) choices at the Mistral shape (fwd+bwd)."""
    options = [(4, 2), (8, 2), (4, 3)]
    lines = ["### config sweep (fwd+bwd ms, Mistral shape; one kernel varied at a time)", ""]
    do = torch.randn(B, T, HQ, D, device=DEV, dtype=DT)
    for scalar, name, fn in ((True, "simple_gla", chunk_simple_gla_triton), (False, "gla", chunk_gla_triton)):
        a = inputs(B, T, HQ, H, D, scalar=scalar)
        base = dict(tc.CONFIGS)
        for kern in base:
            res = []
            for opt in options:
                tc.CONFIGS[kern] = opt
                try:
                    _, fb, _ = time_op(lambda *x: fn(*x), a, do)
                except Exception as e:  # noqa: BLE001
                    fb = float("nan")
                    print(name, kern, opt, "failed:", type(e).__name__, str(e)[:100])
                res.append(f"{opt}: {fb:.3f}")
            tc.CONFIGS.clear()
            tc.CONFIGS.update(base)
            lines.append(f"- {name} {kern}: " + ", ".join(res))
        if not scalar:
            res = []
            for bk in (64, 128):
                tc.DQK_BK["gla"] = bk
                _, fb, _ = time_op(lambda *x: fn(*x), a, do)
                res.append(f"BK={bk}: {fb:.3f}")
            tc.DQK_BK["gla"] = 128
            lines.append("- gla bwd_dqk block K: " + ", ".join(res))
    return "\n".join(lines) + "\n"


def smoke():
    """The gated delta rows on CPU at a tiny shape (fp32: the interpreter computes bf16 dots wrongly)."""
    global DEV, DT
    DEV, DT = "cpu", torch.float32
    print(fmt_table("smoke (CPU, Triton interpreter): B=1, T=100, HQ=4, H=2, D=32",
                    gated_delta_rows(1, 100, 4, 2, 32)))
    lines = ["| op | ms |", "|---|---|"] + [f"| {n} | {t:.3f} |" for n, t in gated_delta_decode_rows(2, 4, 2, 32)]
    print("### smoke decode: B=2, HQ=4, H=2, D=32\n\n" + "\n".join(lines))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true",
                    help="CPU check of the gated delta rows at a tiny shape, through the Triton interpreter "
                         "(fp32; times mean nothing); prints, writes no file")
    ap.add_argument("--gated-delta", action="store_true",
                    help="only the gated delta rows (and SDPA's) at both shapes, plus its decode step")
    args = ap.parse_args()
    if args.smoke:
        smoke()
        return
    dev = torch.cuda.get_device_name()
    cmd = "python " + " ".join(sys.argv)
    parts = [f"# Linear-attention ops on {dev}", "",
             f"torch {torch.__version__}, triton {triton.__version__}; command: `{cmd}`; bf16, "
             "do_bench median; gates logsigmoid(randn)/16; fla without GQA (kv repeated).", ""]
    with_fla = not args.no_fla
    if args.gated_delta:
        for title, shape in (("Mistral-7B layer: B=4, T=4096, HQ=32, H=8, D=128", (4, 4096, 32, 8, 128)),
                             ("SmolLM2-135M layer: B=32, T=2048, HQ=9, H=3, D=64", (32, 2048, 9, 3, 64))):
            q, k, v = inputs(*shape, scalar=False)[:3]
            do = torch.randn_like(q)
            rows = [("sdpa causal (GQA)",) + time_op(sdpa_fn, (q, k, v), do)] + gated_delta_rows(*shape, with_fla)
            parts.append(fmt_table(title, rows))
            print(parts[-1], flush=True)
        lines = ["### Decode: one token, batch 64, HQ=32, H=8, D=128", "", "| op | ms |", "|---|---|"]
        lines += [f"| {n} | {t:.3f} |" for n, t in gated_delta_decode_rows(with_fla=with_fla)]
        parts.append("\n".join(lines) + "\n")
        print(parts[-1], flush=True)
        args.quick, args.sweep = True, False
    else:
        parts.append(fmt_table("Mistral-7B layer: B=4, T=4096, HQ=32, H=8, D=128",
                               row_set(4, 4096, 32, 8, 128, with_fla)))
        print(parts[-1], flush=True)
    if not args.quick:
        parts.append(fmt_table("SmolLM2-135M layer: B=32, T=2048, HQ=9, H=3, D=64",
                               row_set(32, 2048, 9, 3, 64, with_fla)))
        print(parts[-1], flush=True)
        parts.append(scaling_table())
        print(parts[-1], flush=True)
        drows = decode_rows()
        lines = ["### Decode: one token, batch 64, HQ=32, H=8, D=128", "", "| op | ms |", "|---|---|"]
        lines += [f"| {n} | {t:.3f} |" for n, t in drows]
        parts.append("\n".join(lines) + "\n")
        print(parts[-1], flush=True)
    if args.sweep:
        parts.append(sweep())
        print(parts[-1], flush=True)
    text = "\n".join(parts)
    out = args.out or os.path.join(os.path.dirname(__file__), "results",
                                   "linear_ops_" + dev.replace(" ", "_").replace("/", "_") + ".md")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        f.write(text)
    print("wrote", out)


if __name__ == "__main__":
    main()
