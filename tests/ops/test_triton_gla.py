"""Triton GLA and simple-GLA (retention) kernels (chunkwise fwd/bwd, recurrent step) vs the naive
recurrence; every shared test runs for both ops through the `op` fixture.

Without a GPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set by tests/conftest.py
before triton is imported) on fp32 at small shapes; the interpreter computes bf16 dots wrongly,
so bf16 runs only on the GPU, where the same cases also run at real sizes.
"""
import sys
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
import torch.nn.functional as F

from tests.helpers.ops import rel_err
from tests.helpers.triton import DEV, INTERPRET, require_triton

require_triton()

from t2r.ops import triton_utils  # noqa: E402
from t2r.ops.common import triton_chunk as engine  # noqa: E402
from t2r.ops.gla import triton_chunk as tc  # noqa: E402
from t2r.ops.gla import triton_recurrent as tr  # noqa: E402
from t2r.ops.gla.naive import naive_recurrent_gla  # noqa: E402
from t2r.ops.simple_gla import triton_chunk as sc  # noqa: E402
from t2r.ops.simple_gla import triton_recurrent as sr  # noqa: E402
from t2r.ops.simple_gla.naive import naive_recurrent_simple_gla  # noqa: E402


@dataclass(frozen=True)
class Op:
    name: str
    chunk: Callable
    recurrent: Callable
    naive: Callable
    scalar: bool  # one gate per head and step (simple GLA) instead of one per key channel (GLA)


OPS = {
    "gla": Op("gla", tc.chunk_gla_triton, tr.fused_recurrent_gla_triton, naive_recurrent_gla, False),
    "simple_gla": Op("simple_gla", sc.chunk_simple_gla_triton, sr.fused_recurrent_simple_gla_triton,
                     naive_recurrent_simple_gla, True),
}


@pytest.fixture(params=list(OPS))
def op(request, monkeypatch):
    spec = OPS[request.param]
    if spec.scalar and INTERPRET:
        # The interpreter runs the scalar-gate kernels at every size (on the GPU small head dims
        # take the GLA path, see t2r/ops/simple_gla/triton_chunk.py).
        monkeypatch.setattr(sc, "_scalar_kernel_ok", lambda q, v: sc.SCALAR_KERNEL)
    return spec


def gate(shape, kind, gen):
    x = torch.randn(shape, generator=gen)
    if kind == "mild":
        return F.logsigmoid(x) / 16
    if kind == "moderate":
        return F.logsigmoid(2 * x)
    return (-8 + x).clamp(max=-4)  # strong: forgets almost everything every step


def make(op, B, T, HQ, H, K, V, kind="moderate", seed=0, h0=True):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, HQ, K, generator=gen)
    k = torch.randn(B, T, H, K, generator=gen)
    v = torch.randn(B, T, H, V, generator=gen)
    g = gate((B, T, H) if op.scalar else (B, T, H, K), kind, gen)
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


def check(out, ref, tol, strong=False):
    assert out.keys() == ref.keys()
    errs = {key: rel_err(out[key], ref[key]) for key in ref}
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
def test_chunk_fp32(op, shape, kind):
    d = make(op, *shape, kind=kind)
    check(run(op.chunk, d, torch.float32), run(op.naive, d, torch.float32), TOL32, kind == "strong")


@pytest.mark.skipif(INTERPRET, reason="the interpreter computes bf16 dots wrongly")
@pytest.mark.parametrize("shape", SHAPES)
def test_chunk_bf16(op, shape):
    d = make(op, *shape, kind="moderate")
    check(run(op.chunk, d, torch.bfloat16), run(op.naive, d, torch.float32), 2.5e-2)


@pytest.mark.skipif(INTERPRET, reason="fp16 per-channel inputs run in bf16, which the interpreter computes wrongly")
@pytest.mark.parametrize("kind", ["mild", "moderate"])
def test_chunk_fp16(op, kind):
    d = make(op, 2, 300, 4, 2, 64, 64, kind=kind)
    check(run(op.chunk, d, torch.float16), run(op.naive, d, torch.float32), 2.5e-2)


def test_fp16_per_channel_runs_in_bf16(monkeypatch):
    """fp16 inputs of the per-channel kernels run in bf16 (their anchored decay factors overflow
    fp16 for moderate gates: NaN before) and come back in fp16."""
    seen = {}

    def fake_apply(q, k, v, g, *rest):
        seen["dtypes"] = (q.dtype, k.dtype, v.dtype)
        return torch.zeros(q.shape[:3] + (v.shape[-1],), dtype=v.dtype, device=q.device), None

    monkeypatch.setattr(engine._ChunkLinearAttnFunction, "apply", fake_apply)
    q, k, v = (torch.randn(1, 8, 2, 16, dtype=torch.float16, device=DEV) for _ in range(3))
    o, _ = tc.chunk_gla_triton(q, k, v, -torch.rand(1, 8, 2, 16, device=DEV))
    assert seen["dtypes"] == (torch.bfloat16,) * 3 and o.dtype == torch.float16


def test_no_initial_state_and_no_final_grad(op):
    d = make(op, 1, 90, 2, 1, 32, 32, h0=False)
    q, k, v, g = (d[n].to(DEV).detach().requires_grad_(True) for n in "qkvg")   # fresh leaves per run
    o, ht = op.chunk(q, k, v, g)
    assert ht is None
    o.float().mul(d["do"].to(DEV)).sum().backward()
    q2, k2, v2, g2 = (d[n].to(DEV).detach().requires_grad_(True) for n in "qkvg")
    o2, _ = op.naive(q2, k2, v2, g2)
    o2.mul(d["do"].to(DEV)).sum().backward()
    for a, b in [(o, o2), (q.grad, q2.grad), (k.grad, k2.grad), (v.grad, v2.grad), (g.grad, g2.grad)]:
        assert rel_err(a, b) < TOL32


def test_state_chaining(op):
    d = make(op, 1, 130, 2, 2, 32, 32)
    dev = {n: d[n].to(DEV) for n in ("q", "k", "v", "g", "h0")}
    o, ht = op.chunk(dev["q"], dev["k"], dev["v"], dev["g"], initial_state=dev["h0"], output_final_state=True)
    cut = 70
    part = lambda t, a, b: t[:, a:b]  # noqa: E731
    o1, h1 = op.chunk(*(part(dev[n], 0, cut) for n in "qkvg"), initial_state=dev["h0"], output_final_state=True)
    o2, h2 = op.chunk(*(part(dev[n], cut, None) for n in "qkvg"), initial_state=h1, output_final_state=True)
    assert rel_err(torch.cat([o1, o2], 1), o) < TOL32
    assert rel_err(h2, ht) < TOL32


@pytest.mark.parametrize("segments", [2, 3])
def test_segmented_state_scans(op, segments, monkeypatch):
    """Long sequences scan their states in parallel segments (triton_utils.num_segments): forcing
    the split on short ones (5 chunks into 2 or 3 segments) still matches the reference."""
    monkeypatch.setattr(triton_utils, "SEGMENTS", segments)
    d = make(op, 2, 300, 4, 2, 32, 32)
    check(run(op.chunk, d, torch.float32), run(op.naive, d, torch.float32), TOL32)


@pytest.mark.parametrize("segments", [None, 3])
@pytest.mark.parametrize("lens", [[30, 70, 1, 64], [129]])
def test_varlen_equals_separate_runs(op, lens, segments, monkeypatch):
    """Packed sequences equal separate runs, also cut into 3 scan segments each (empty ones too)."""
    monkeypatch.setattr(triton_utils, "SEGMENTS", segments)
    T = sum(lens)
    d = make(op, 1, T, 4, 2, 32, 32)
    N = len(lens)
    gen = torch.Generator().manual_seed(3)
    d["h0"] = torch.randn(N, 2, 32, 32, generator=gen)
    d["dht"] = torch.randn(N, 2, 32, 32, generator=gen)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    out = run(op.chunk, d, torch.float32, cu_seqlens=cu)
    refs = []
    for i in range(N):
        a, b = int(cu[i]), int(cu[i + 1])
        di = {n: d[n][:, a:b] for n in ("q", "k", "v", "g", "do")}
        di["h0"], di["dht"] = d["h0"][i:i + 1], d["dht"][i:i + 1]
        refs.append(run(op.naive, di, torch.float32))
    ref = {key: torch.cat([r[key] for r in refs], 0 if key in ("ht", "dh0") else 1) for key in refs[0]}
    check(out, ref, TOL32)


@pytest.mark.parametrize("T", [1, 3])
@pytest.mark.parametrize("dims", [(3, 1, 32, 16), (4, 2, 64, 64)])
def test_recurrent_step(op, T, dims):
    HQ, H, K, V = dims
    d = make(op, 5, T, HQ, H, K, V)
    dev = {n: d[n].to(DEV) for n in ("q", "k", "v", "g", "h0")}
    o, ht = op.recurrent(dev["q"], dev["k"], dev["v"], dev["g"], initial_state=dev["h0"], output_final_state=True)
    o2, ht2 = op.naive(dev["q"], dev["k"], dev["v"], dev["g"], initial_state=dev["h0"], output_final_state=True)
    assert rel_err(o, o2) < 1e-5 and rel_err(ht, ht2) < 1e-5
    # packed sequences: same as separate runs
    cu = torch.tensor([0, T, 2 * T], dtype=torch.int32, device=DEV)
    pack = lambda t: t[:2].reshape(1, 2 * T, *t.shape[2:])  # noqa: E731
    o3, ht3 = op.recurrent(*(pack(dev[n]) for n in "qkvg"), initial_state=dev["h0"][:2],
                           output_final_state=True, cu_seqlens=cu)
    assert rel_err(o3, pack(o2)) < 1e-5 and rel_err(ht3, ht2[:2]) < 1e-5


@pytest.mark.skipif(INTERPRET, reason="GPU only")
def test_recurrent_step_bf16(op):
    d = make(op, 64, 1, 32, 8, 128, 128)
    dev = {n: d[n].to(DEV) for n in ("q", "k", "v", "g", "h0")}
    qkv = [dev[n].bfloat16() for n in "qkv"]
    o, ht = op.recurrent(*qkv, dev["g"], initial_state=dev["h0"], output_final_state=True)
    o2, ht2 = op.naive(*qkv, dev["g"], initial_state=dev["h0"], output_final_state=True)
    assert o.dtype == torch.bfloat16 and rel_err(o, o2) < 1e-2 and rel_err(ht, ht2) < 1e-5


@pytest.mark.skipif(INTERPRET, reason="GPU config check")
@pytest.mark.parametrize("op", ["gla"], indirect=True)
@pytest.mark.parametrize("bk", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dqk_block_k_configs(op, bk, dtype):
    """Both K-blocks of the dq/dk kernel are gradient-checked on the GPU (Triton 3.6 Hopper bugs)."""
    old = engine.DQK_BK["gla"]
    engine.DQK_BK["gla"] = bk
    try:
        d = make(op, 2, 600, 8, 2, 128, 128, kind="moderate")
        check(run(op.chunk, d, dtype), run(op.naive, d, torch.float32), TOL32 if dtype == torch.float32 else 2.5e-2)
    finally:
        engine.DQK_BK["gla"] = old


@pytest.mark.skipif(INTERPRET, reason="GPU check of the fallback path")
@pytest.mark.parametrize("op", ["simple_gla"], indirect=True)
@pytest.mark.parametrize("shape", SHAPES[:3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fallback_through_gla_kernels(op, shape, dtype):
    mod = sys.modules[op.chunk.__module__]
    mod.SCALAR_KERNEL = False
    try:
        d = make(op, *shape, kind="moderate")
        check(run(op.chunk, d, dtype), run(op.naive, d, torch.float32),
              TOL32 if dtype == torch.float32 else 2.5e-2)
    finally:
        mod.SCALAR_KERNEL = True


@pytest.mark.parametrize("scalar", [False, True])
@pytest.mark.parametrize("packed", [False, True])
def test_custom_op_contract(scalar, packed):
    """The torch.compile path (`t2r::chunk_linear_attn`): fake shapes, schema and autograd registration hold
    (torch.library.opcheck), with an initial state and with packed sequences."""
    B, T, HQ, H, K = (1, 70, 4, 2, 32)
    q = torch.randn(B, T, HQ, K, device=DEV, requires_grad=True)
    k, v = (torch.randn(B, T, H, K, device=DEV, requires_grad=True) for _ in range(2))
    shape = (B, T, H) if scalar else (B, T, H, K)
    g = (torch.nn.functional.logsigmoid(torch.randn(shape, device=DEV)) / 16).requires_grad_(True)
    cu = torch.tensor([0, 30, 70], dtype=torch.int32, device=DEV) if packed else None
    h0 = torch.randn(2 if packed else B, H, K, K, device=DEV, requires_grad=True)
    torch.library.opcheck(engine._chunk_op, (q, k, v, g, h0, cu, K ** -0.5, scalar, 64, 16),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))
