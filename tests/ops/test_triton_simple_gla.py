"""Triton simple-GLA (retention) kernels (chunkwise fwd/bwd, recurrent step) vs the naive recurrence.

Without a GPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set before
triton is imported) on fp32 at small shapes; the interpreter computes bf16 dots wrongly,
so bf16 runs only on the GPU, where the same cases also run at real sizes.
"""
import importlib
import os
import sys

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
triton = pytest.importorskip("triton")

CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
if not CUDA and not INTERPRET:
    pytest.skip("needs a GPU or TRITON_INTERPRET=1", allow_module_level=True)


def _fresh(name):
    """Import (or re-import, if it was decorated before TRITON_INTERPRET was set) a kernel module."""
    mod = sys.modules.get(name)
    return importlib.reload(mod) if (mod is not None and INTERPRET) else importlib.import_module(name)


_fresh("t2r.ops.triton_utils")
tc = _fresh("t2r.ops.gla.triton_chunk")
tr = _fresh("t2r.ops.gla.triton_recurrent")
from t2r.ops.simple_gla.naive import naive_recurrent_simple_gla  # noqa: E402

DEV = "cuda" if CUDA else "cpu"
SCALAR = True
chunk_fn = _fresh("t2r.ops.simple_gla.triton_chunk").chunk_simple_gla_triton
recurrent_fn = tr.fused_recurrent_simple_gla_triton
naive_fn = naive_recurrent_simple_gla
if INTERPRET:
    # The interpreter runs the scalar-gate kernels at every size (on the GPU small head dims
    # take the GLA path, see t2r/ops/simple_gla/triton_chunk.py).
    _mod = sys.modules[chunk_fn.__module__]
    _mod._scalar_kernel_ok = lambda q, v: _mod.SCALAR_KERNEL


def gate(shape, kind, gen):
    x = torch.randn(shape, generator=gen)
    if kind == "mild":
        return F.logsigmoid(x) / 16
    if kind == "moderate":
        return F.logsigmoid(2 * x)
    return (-8 + x).clamp(max=-4)  # strong: forgets almost everything every step


def make(B, T, HQ, H, K, V, kind="moderate", seed=0, h0=True):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, HQ, K, generator=gen)
    k = torch.randn(B, T, H, K, generator=gen)
    v = torch.randn(B, T, H, V, generator=gen)
    g = gate((B, T, H) if SCALAR else (B, T, H, K), kind, gen)
    s0 = torch.randn(B, H, K, V, generator=gen) if h0 else None
    do = torch.randn(B, T, HQ, V, generator=gen)
    dht = torch.randn(B, H, K, V, generator=gen)
    return dict(q=q, k=k, v=v, g=g, h0=s0, do=do, dht=dht)


def run(fn, d, dtype, cu_seqlens=None, **kw):
    """Forward + backward through output and final state; returns fp32 results by name."""
    names = ["q", "k", "v", "g"] + (["h0"] if d["h0"] is not None else [])
    leaves = {}
    for n in names:
        t = d[n].to(DEV)
        t = t.to(dtype) if n in ("q", "k", "v") else t.float()
        leaves[n] = t.detach().requires_grad_(True)
    extra = {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens.to(DEV)}
    o, ht = fn(leaves["q"], leaves["k"], leaves["v"], leaves["g"], initial_state=leaves.get("h0"),
               output_final_state=True, **extra, **kw)
    loss = (o.float() * d["do"].to(DEV)).sum() + (ht * d["dht"][: ht.shape[0]].to(DEV)).sum()
    loss.backward()
    out = {"o": o.float(), "ht": ht}
    out.update({"d" + n: t.grad.float() for n, t in leaves.items()})
    return out


def rel(a, b):
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def check(out, ref, tol, strong=False):
    assert out.keys() == ref.keys()
    errs = {key: rel(out[key], ref[key]) for key in ref}
    if strong:
        # dg = reverse cumsum of q*dq - k*dk (the form every chunked kernel uses): with gates
        # near -8 per step the true dg is ~1e-3 of those terms, so judge its error on their scale.
        scale = (ref["dq"].norm() + ref["dk"].norm()).item()
        errs["dg"] = (out["dg"] - ref["dg"]).double().norm().item() / scale
    for key, err in errs.items():
        assert torch.isfinite(out[key]).all(), f"{key}: non-finite"
        # dg = reverse cumsum of q*dq - k*dk: cancellation costs a few digits in fp32
        assert err < (10 * tol if key == "dg" else tol), f"{key}: rel err {err:.2e} > {tol:.0e} (all: {errs})"


TOL32 = 1e-4 if INTERPRET else 5e-3   # GPU fp32 dots run as tf32

SHAPES = [
    # B, T, HQ, H, K, V
    (2, 100, 4, 2, 32, 48),   # GQA, ragged last chunk, V not a power of 2
    (1, 64, 1, 1, 16, 16),    # exactly one chunk, smallest head dims
    (1, 150, 3, 1, 64, 32),   # group of 3, three chunks
]
if not INTERPRET:
    SHAPES += [(2, 1000, 8, 2, 128, 128), (2, 777, 9, 3, 64, 64), (1, 300, 4, 4, 128, 64)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", ["mild", "moderate", "strong"])
def test_chunk_fp32(shape, kind):
    d = make(*shape, kind=kind)
    check(run(chunk_fn, d, torch.float32), run(naive_fn, d, torch.float32), TOL32, kind == "strong")


@pytest.mark.skipif(INTERPRET, reason="the interpreter computes bf16 dots wrongly")
@pytest.mark.parametrize("shape", SHAPES)
def test_chunk_bf16(shape):
    d = make(*shape, kind="moderate")
    check(run(chunk_fn, d, torch.bfloat16), run(naive_fn, d, torch.float32), 2.5e-2)


def test_no_initial_state_and_no_final_grad():
    d = make(1, 90, 2, 1, 32, 32, h0=False)
    q, k, v, g = (d[n].to(DEV).requires_grad_(True) for n in "qkvg")
    o, ht = chunk_fn(q, k, v, g)
    assert ht is None
    o.float().mul(d["do"].to(DEV)).sum().backward()
    q2, k2, v2, g2 = (d[n].to(DEV).requires_grad_(True) for n in "qkvg")
    o2, _ = naive_fn(q2, k2, v2, g2)
    o2.mul(d["do"].to(DEV)).sum().backward()
    for a, b in [(o, o2), (q.grad, q2.grad), (k.grad, k2.grad), (v.grad, v2.grad), (g.grad, g2.grad)]:
        assert rel(a, b) < TOL32


def test_state_chaining():
    d = make(1, 130, 2, 2, 32, 32)
    dev = {n: d[n].to(DEV) for n in ("q", "k", "v", "g", "h0")}
    o, ht = chunk_fn(dev["q"], dev["k"], dev["v"], dev["g"], initial_state=dev["h0"], output_final_state=True)
    cut = 70
    part = lambda t, a, b: t[:, a:b]  # noqa: E731
    o1, h1 = chunk_fn(*(part(dev[n], 0, cut) for n in "qkvg"), initial_state=dev["h0"], output_final_state=True)
    o2, h2 = chunk_fn(*(part(dev[n], cut, None) for n in "qkvg"), initial_state=h1, output_final_state=True)
    assert rel(torch.cat([o1, o2], 1), o) < TOL32
    assert rel(h2, ht) < TOL32


@pytest.mark.parametrize("lens", [[30, 70, 1, 64], [129]])
def test_varlen_equals_separate_runs(lens):
    T = sum(lens)
    d = make(1, T, 4, 2, 32, 32)
    N = len(lens)
    gen = torch.Generator().manual_seed(3)
    d["h0"] = torch.randn(N, 2, 32, 32, generator=gen)
    d["dht"] = torch.randn(N, 2, 32, 32, generator=gen)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    out = run(chunk_fn, d, torch.float32, cu_seqlens=cu)
    refs = []
    for i in range(N):
        a, b = int(cu[i]), int(cu[i + 1])
        di = {n: d[n][:, a:b] for n in ("q", "k", "v", "g", "do")}
        di["h0"], di["dht"] = d["h0"][i:i + 1], d["dht"][i:i + 1]
        refs.append(run(naive_fn, di, torch.float32))
    ref = {key: torch.cat([r[key] for r in refs], 0 if key in ("ht", "dh0") else 1) for key in refs[0]}
    check(out, ref, TOL32)


@pytest.mark.parametrize("T", [1, 3])
@pytest.mark.parametrize("dims", [(3, 1, 32, 16), (4, 2, 64, 64)])
def test_recurrent_step(T, dims):
    HQ, H, K, V = dims
    d = make(5, T, HQ, H, K, V)
    dev = {n: d[n].to(DEV) for n in ("q", "k", "v", "g", "h0")}
    o, ht = recurrent_fn(dev["q"], dev["k"], dev["v"], dev["g"], initial_state=dev["h0"], output_final_state=True)
    o2, ht2 = naive_fn(dev["q"], dev["k"], dev["v"], dev["g"], initial_state=dev["h0"], output_final_state=True)
    assert rel(o, o2) < 1e-5 and rel(ht, ht2) < 1e-5
    # packed sequences: same as separate runs
    cu = torch.tensor([0, T, 2 * T], dtype=torch.int32, device=DEV)
    pack = lambda t: t[:2].reshape(1, 2 * T, *t.shape[2:])  # noqa: E731
    o3, ht3 = recurrent_fn(*(pack(dev[n]) for n in "qkvg"), initial_state=dev["h0"][:2],
                           output_final_state=True, cu_seqlens=cu)
    assert rel(o3, pack(o2)) < 1e-5 and rel(ht3, ht2[:2]) < 1e-5


@pytest.mark.skipif(INTERPRET, reason="GPU only")
def test_recurrent_step_bf16():
    d = make(64, 1, 32, 8, 128, 128)
    dev = {n: d[n].to(DEV) for n in ("q", "k", "v", "g", "h0")}
    qkv = [dev[n].bfloat16() for n in "qkv"]
    o, ht = recurrent_fn(*qkv, dev["g"], initial_state=dev["h0"], output_final_state=True)
    o2, ht2 = naive_fn(*qkv, dev["g"], initial_state=dev["h0"], output_final_state=True)
    assert o.dtype == torch.bfloat16 and rel(o, o2) < 1e-2 and rel(ht, ht2) < 1e-5


@pytest.mark.skipif(INTERPRET, reason="GPU check of the fallback path")
@pytest.mark.parametrize("shape", SHAPES[:3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fallback_through_gla_kernels(shape, dtype):
    mod = sys.modules[chunk_fn.__module__]
    mod.SCALAR_KERNEL = False
    try:
        d = make(*shape, kind="moderate")
        check(run(chunk_fn, d, dtype), run(naive_fn, d, torch.float32),
              TOL32 if dtype == torch.float32 else 2.5e-2)
    finally:
        mod.SCALAR_KERNEL = True
