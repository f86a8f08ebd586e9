"""Triton GSA kernels (chunkwise fwd/bwd, recurrent decode) vs the naive recurrence.

Without a GPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set by tests/conftest.py
before triton is imported) on fp32 at small shapes; the interpreter computes bf16 dots wrongly,
so bf16 runs only on the GPU, where the same cases also run at real sizes.
Write weights s are drawn independently of g (with s = 1 - exp(g) and strong decays every
slot holds the same key and dq is rounding noise), plus one mild case with s = 1 - exp(g).
"""
import pytest
import torch
import torch.nn.functional as F

from tests.helpers.ops import rel_err
from tests.helpers.triton import CUDA, DEV, require_triton

require_triton()

from t2r.ops import triton_utils  # noqa: E402
from t2r.ops.gsa import triton_chunk as tc  # noqa: E402
from t2r.ops.gsa import triton_recurrent as tr  # noqa: E402
from t2r.ops.gsa.naive import naive_recurrent_gsa  # noqa: E402

FP32_TOL = 1e-2 if CUDA else 1e-4      # tf32 dots on the GPU (seen: 2e-3 to 4e-3 at D64-128)
BF16_TOL = 3e-2


def make(B, T, HQ, H, K, V, M, gate="moderate", seed=0, h0=True, tied=False, n_state=None):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, H, M, generator=gen)
    # mild (the layer's gates) takes the kernels' one-anchor path; strong (~ -3.3 nats per step,
    # > 69 nats per chunk) the per-block path; moderate mixes both across chunks and slots
    g = {"moderate": F.logsigmoid(2 * x), "mild": F.logsigmoid(x) / 8, "strong": F.logsigmoid(x) - 3}[gate]
    s = 1 - g.exp() if tied else torch.rand(B, T, H, M, generator=gen) * 2
    inputs = dict(q=torch.randn(B, T, HQ, K, generator=gen), k=torch.randn(B, T, H, K, generator=gen),
                  v=torch.randn(B, T, H, V, generator=gen), s=s, g=g)
    n = B if n_state is None else n_state
    state = (torch.randn(n, H, K, M, generator=gen), torch.randn(n, H, M, V, generator=gen)) if h0 else None
    return inputs, state


def fwd_bwd(fn, inputs, h0, dtype=torch.float32, **kw):
    """Run fn with output_final_state=True, backprop fixed cotangents, return fp32 results."""
    # detach: fresh leaves per call (on the CPU .to() returns the same tensor, whose .grad would
    # then be shared, and accumulated into, by every call of a comparison)
    leaves = {n: t.to(DEV, dtype).detach().requires_grad_(True) for n, t in inputs.items()}
    h = tuple(t.to(DEV).detach().requires_grad_(True) for t in h0) if h0 is not None else None
    o, (fk, fv) = fn(*leaves.values(), initial_state=h, output_final_state=True, **kw)
    gen = torch.Generator().manual_seed(1234)
    cot = [torch.randn(t.shape, generator=gen).to(DEV) for t in (o, fk, fv)]
    loss = (o.float() * cot[0]).sum() + (fk * cot[1]).sum() + (fv * cot[2]).sum()
    loss.backward()
    assert fk.dtype == torch.float32 and fv.dtype == torch.float32
    out = {"o": o, "final_k": fk, "final_v": fv}
    out.update({"d" + n: t.grad for n, t in leaves.items()})
    if h is not None:
        out.update({"dh0_k": h[0].grad, "dh0_v": h[1].grad})
    return {n: t.detach().float() for n, t in out.items()}


def naive(q, k, v, s, g, initial_state=None, output_final_state=True, scale=None):
    """The reference in fp32 (inputs upcast, outputs in the inputs' dtype)."""
    dt = q.dtype
    o, st = naive_recurrent_gsa(q.float(), k.float(), v.float(), s.float(), g.float(), scale,
                                initial_state, output_final_state)
    return o.to(dt), st


# The gate gradient is a reverse cumulative sum of differences of O(1) bf16 products, so its error
# relative to its own (smaller) norm is the largest: 3.1e-2 was measured on an H100 at (B2 T300 D128 M64).
DG_BF16_TOL = 5e-2


def check(out, ref, tol, dg_scale=None):
    """Relative errors within tol; with dg_scale, dg's error is judged against that norm instead
    (strong gates: dg = reverse cumsum of (z dz + p dp - s ds), whose terms nearly cancel, so
    tf32's rounding of the terms shows as a large error relative to the small dg)."""
    assert out.keys() == ref.keys()
    for n in ref:
        assert torch.isfinite(out[n]).all(), f"{n}: non-finite"
        err = rel_err(out[n], ref[n])
        if n == "dg" and dg_scale is not None:
            err = (out[n] - ref[n]).double().norm().item() / dg_scale
        limit = DG_BF16_TOL if n == "dg" and tol == BF16_TOL else tol
        assert err <= limit, f"{n}: relative error {err:.2e} > {limit:.0e}"


# The interpreter runs tiny dims; the GPU runs the same cases at the dims the kernels ship for
# (odd tiny dims on the GPU are checked last, in test_gpu_tiny_dims, so a crash there hides nothing).
SMALL = dict(K=64, V=64, M=64) if CUDA else dict(K=16, V=32, M=16)
CASES = [  # (B, T, HQ, H, gate, h0)
    (1, 1, 4, 2, "moderate", True),
    (2, 70, 4, 2, "moderate", True),
    (1, 130, 2, 2, "mild", False),
    (2, 100, 4, 2, "strong", True),
]


@pytest.mark.parametrize("B,T,HQ,H,gate,h0", CASES)
def test_chunk_matches_reference(B, T, HQ, H, gate, h0):
    inputs, state = make(B, T, HQ, H, **SMALL, gate=gate, h0=h0)
    ref = fwd_bwd(naive, inputs, state)
    dg_scale = (inputs["s"] * ref["ds"].cpu()).double().norm().item() if gate == "strong" else None
    check(fwd_bwd(tc.chunk_gsa_triton, inputs, state), ref, FP32_TOL, dg_scale)


@pytest.mark.parametrize("gate", ["mild", "strong"])
def test_output_columns_in_steps(monkeypatch, gate):
    """_fwd_o writes o and _bwd_dp writes dq COLUMNS columns at a time: several steps (both
    anchor variants) agree with the reference, as one step does above."""
    monkeypatch.setattr(tc, "COLUMNS", 16 if CUDA else 8)
    inputs, state = make(1, 70, 4, 2, **SMALL, gate=gate)
    ref = fwd_bwd(naive, inputs, state)
    dg_scale = (inputs["s"] * ref["ds"].cpu()).double().norm().item() if gate == "strong" else None
    check(fwd_bwd(tc.chunk_gsa_triton, inputs, state), ref, FP32_TOL, dg_scale)


def _mixed_gates(B, T, H, M, seed=0):
    """Gates that make some chunks steep (sub-block launch) and others mild (one-anchor launch):
    sequence 0 mild, 1 strong, 2 alternating mild / strong chunks. Returns g [B, T, H, M] and the
    expected steep flag per (chunk, sequence): strong gates over a full chunk lose ~240 nats
    (far above the ~69 one anchor holds), a partial chunk of 8 strong steps ~30 (far below)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, H, M, generator=gen)
    mild, strong = F.logsigmoid(x) / 8, F.logsigmoid(x) - 3
    chunk = torch.arange(T) // tc.BT
    is_strong = torch.stack([torch.zeros(T, dtype=torch.bool), torch.ones(T, dtype=torch.bool), chunk % 2 == 1])
    g = torch.where(is_strong[:, :, None, None], strong, mild)
    full = torch.arange(0, T, tc.BT) + tc.BT <= T
    return g, is_strong[:, ::tc.BT] & full                     # [B, chunks]


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16] if CUDA else [torch.float32])
def test_mixed_anchor_variants(packed, dtype, monkeypatch):
    """Both launches of every per-chunk kernel in one call: _fwd_o flags exactly the steep chunks
    (and lists each once), and o, the final state and all gradients match the reference. Two
    sub-block programs per query head, so each strides through several listed chunks."""
    monkeypatch.setattr(tc, "STEEP_PROGRAMS", 2)
    B, T, H = 3, 200, 2
    inputs, state = make(B, T, 4, H, **SMALL)
    inputs["g"], steep = _mixed_gates(B, T, H, SMALL["M"])
    if dtype == torch.bfloat16:
        inputs = {n: t.to(dtype).float() for n, t in inputs.items()}
    steep = steep[:, :, None].expand(B, -1, H)                 # [B, chunks, H]
    bounds = [0, T, 2 * T, 3 * T]
    if packed:
        inputs = {n: t.reshape(1, B * T, *t.shape[2:]) for n, t in inputs.items()}
    cu = torch.tensor(bounds, device=DEV) if packed else None

    q, k, v, s, g = (t.to(DEV, dtype).contiguous() for t in inputs.values())
    *_, (flags, lst, P) = tc._fwd(q, k, v, s, g, q.shape[-1] ** -0.5, None, None, False,
                                  None if cu is None else cu.to(torch.int32))
    # flag i_tc * NBH + i_bh; packed: NBH = H and chunks numbered sequence by sequence
    want = steep.reshape(-1, H) if packed else steep.transpose(0, 1).reshape(-1, B * H)
    assert torch.equal(flags.cpu().view(want.shape), want.to(torch.int8))
    n = int(lst[0])
    assert n == int(want.sum()) > 0 and sorted(lst[1:1 + n].tolist()) == want.flatten().nonzero().flatten().tolist()

    out = fwd_bwd(tc.chunk_gsa_triton, inputs, state, dtype=dtype, cu_seqlens=cu)
    ref = fwd_bwd(_separate(bounds) if packed else naive, inputs, state)
    dg_scale = (inputs["s"].reshape(ref["ds"].shape) * ref["ds"].cpu()).double().norm().item()
    check(out, ref, FP32_TOL if dtype == torch.float32 else BF16_TOL, dg_scale)


def test_chunk_tied_write_weights_mild():
    inputs, state = make(1, 100, 4, 2, **SMALL, gate="mild", tied=True)
    check(fwd_bwd(tc.chunk_gsa_triton, inputs, state), fwd_bwd(naive, inputs, state), FP32_TOL)


@pytest.mark.parametrize("split", [64, 70])
def test_state_chaining(split):
    inputs, state = make(1, 130, 4, 2, **SMALL)
    inputs = {n: t.to(DEV) for n, t in inputs.items()}
    state = tuple(t.to(DEV) for t in state)
    o, (fk, fv) = tc.chunk_gsa_triton(**inputs, initial_state=state, output_final_state=True)
    o1, mid = tc.chunk_gsa_triton(**{n: t[:, :split] for n, t in inputs.items()}, initial_state=state,
                                  output_final_state=True)
    o2, (lk, lv) = tc.chunk_gsa_triton(**{n: t[:, split:] for n, t in inputs.items()}, initial_state=mid,
                                       output_final_state=True)
    assert rel_err(torch.cat([o1, o2], 1), o) < FP32_TOL
    assert rel_err(lk, fk) < FP32_TOL and rel_err(lv, fv) < FP32_TOL


def _separate(bounds):
    def run(q, k, v, s, g, initial_state, output_final_state):
        outs, ks, vs = [], [], []
        for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
            h = None if initial_state is None else tuple(t[i:i + 1] for t in initial_state)
            o, (fk, fv) = naive(*(t[:, a:b] for t in (q, k, v, s, g)), initial_state=h)
            outs.append(o)
            ks.append(fk)
            vs.append(fv)
        return torch.cat(outs, 1), (torch.cat(ks), torch.cat(vs))
    return run


@pytest.mark.parametrize("segments", [2, 3])
def test_segmented_state_scans(segments, monkeypatch):
    """Long sequences scan their slot memories in parallel segments (triton_utils.num_segments):
    forcing the split on short ones (4 chunks into 2 or 3 segments) still matches the reference."""
    monkeypatch.setattr(triton_utils, "SEGMENTS", segments)
    inputs, state = make(2, 250, 4, 2, **SMALL)
    check(fwd_bwd(tc.chunk_gsa_triton, inputs, state), fwd_bwd(naive, inputs, state), FP32_TOL)


@pytest.mark.parametrize("segments", [None, 3])
def test_packed_sequences(segments, monkeypatch):
    """Packed sequences equal separate runs, also cut into 3 scan segments each (empty ones too)."""
    monkeypatch.setattr(triton_utils, "SEGMENTS", segments)
    bounds = [0, 7, 71, 200]
    inputs, state = make(1, 200, 4, 2, **SMALL, n_state=3)
    cu = torch.tensor(bounds, device=DEV)
    check(fwd_bwd(tc.chunk_gsa_triton, inputs, state, cu_seqlens=cu),
          fwd_bwd(_separate(bounds), inputs, state), FP32_TOL)


@pytest.mark.parametrize("T,cu", [(1, None), (3, None), (9, [0, 2, 9])])
def test_recurrent_matches_reference(T, cu):
    n = 2 if cu is None else len(cu) - 1
    B = 2 if cu is None else 1
    inputs, state = make(B, T, 4, 2, **SMALL, n_state=n)
    dev_in = {k: t.to(DEV) for k, t in inputs.items()}
    dev_state = tuple(t.to(DEV) for t in state)
    with torch.no_grad():
        if cu is None:
            o, (fk, fv) = tr.fused_recurrent_gsa_triton(**dev_in, initial_state=dev_state, output_final_state=True)
            ro, (rk, rv) = naive(**dev_in, initial_state=dev_state)
        else:
            o, (fk, fv) = tr.fused_recurrent_gsa_triton(**dev_in, initial_state=dev_state, output_final_state=True,
                                                        cu_seqlens=torch.tensor(cu, device=DEV))
            ro, (rk, rv) = _separate(cu)(*dev_in.values(), dev_state, True)
    for a, b in ((o, ro), (fk, rk), (fv, rv)):
        assert rel_err(a, b) < 1e-4


# ---------------------------------------------------------------- GPU only: real shapes, bf16
gpu = pytest.mark.skipif(not CUDA, reason="real shapes and bf16 need the GPU")
REAL = [  # (B, T, HQ, H, K, V, M)
    (2, 300, 8, 2, 128, 128, 64),
    (2, 200, 9, 3, 64, 64, 64),
]


@gpu
@pytest.mark.parametrize("shape", REAL)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_real_shapes(shape, dtype):
    B, T, HQ, H, K, V, M = shape
    inputs, state = make(B, T, HQ, H, K, V, M)
    ref = fwd_bwd(naive, {n: t.to(dtype).float() for n, t in inputs.items()}, state)
    out = fwd_bwd(tc.chunk_gsa_triton, inputs, state, dtype=dtype)
    check(out, ref, BF16_TOL if dtype == torch.bfloat16 else FP32_TOL)


@gpu
@pytest.mark.parametrize("gate", ["mild", "moderate"])
def test_gpu_fp16(gate):
    """fp16 inputs run the kernels in bf16 (the anchored factors overflow fp16: NaN before)."""
    inputs, state = make(2, 300, 8, 2, 128, 128, 64, gate=gate)
    ref = fwd_bwd(naive, {n: t.half().float() for n, t in inputs.items()}, state)
    check(fwd_bwd(tc.chunk_gsa_triton, inputs, state, dtype=torch.float16), ref, BF16_TOL)


def test_fp16_runs_in_bf16(monkeypatch):
    seen = {}

    def fake_apply(q, k, v, s, g, *rest):
        seen["dtypes"] = (q.dtype, k.dtype, v.dtype, s.dtype)
        return torch.zeros(q.shape[:3] + (v.shape[-1],), dtype=v.dtype, device=q.device), None, None

    monkeypatch.setattr(tc.ChunkGSAFunction, "apply", fake_apply)
    q, k, v = (torch.randn(1, 8, 2, 16, dtype=torch.float16, device=DEV) for _ in range(3))
    s, g = torch.rand(1, 8, 2, 4, dtype=torch.float16, device=DEV), -torch.rand(1, 8, 2, 4, device=DEV)
    o, _ = tc.chunk_gsa_triton(q, k, v, s, g)
    assert seen["dtypes"] == (torch.bfloat16,) * 4 and o.dtype == torch.float16


@gpu
def test_gpu_packed_bf16():
    bounds = [0, 100, 164, 400]
    inputs, state = make(1, 400, 8, 2, 128, 128, 64, n_state=3)
    inputs = {n: t.to(torch.bfloat16).float() for n, t in inputs.items()}
    cu = torch.tensor(bounds, device=DEV)
    check(fwd_bwd(tc.chunk_gsa_triton, inputs, state, dtype=torch.bfloat16, cu_seqlens=cu),
          fwd_bwd(_separate(bounds), inputs, state), BF16_TOL)


@gpu
def test_gpu_recurrent_bf16():
    inputs, state = make(4, 2, 32, 8, 128, 128, 64)
    dev_in = {k: t.to(DEV, torch.bfloat16) for k, t in inputs.items()}
    dev_state = tuple(t.to(DEV) for t in state)
    with torch.no_grad():
        o, (fk, fv) = tr.fused_recurrent_gsa_triton(**dev_in, initial_state=dev_state, output_final_state=True)
        ro, (rk, rv) = naive(**dev_in, initial_state=dev_state)
    assert rel_err(o, ro) < 1e-2 and rel_err(fk, rk) < 1e-4 and rel_err(fv, rv) < 1e-4


@gpu
def test_gpu_public_dispatch():
    """t2r.ops.gsa on bf16 CUDA tensors runs the Triton kernels (chunk with grad, recurrent without);
    fp32 takes the PyTorch forms (t2r.ops.backend)."""
    from t2r.ops.gsa import gsa
    inputs, state = make(2, 130, 8, 2, 64, 64, 64)
    bf16 = torch.bfloat16
    check(fwd_bwd(gsa, inputs, state, dtype=bf16), fwd_bwd(tc.chunk_gsa_triton, inputs, state, dtype=bf16), 0.0)
    dev_in = {k: t[:, :1].to(DEV, bf16) for k, t in inputs.items()}
    dev_state = tuple(t.to(DEV) for t in state)
    with torch.no_grad():
        o, (fk, fv) = gsa(**dev_in, initial_state=dev_state, output_final_state=True)
        ko, (kk, kv) = tr.fused_recurrent_gsa_triton(**dev_in, initial_state=dev_state, output_final_state=True)
    assert torch.equal(o, ko) and torch.equal(fk, kk) and torch.equal(fv, kv)


@gpu
def test_gpu_tiny_dims():
    """Direct calls with head/slot dims below 64 run on 64-wide tiles (see triton_chunk._tile)."""
    inputs, state = make(1, 70, 4, 2, K=16, V=32, M=16)
    check(fwd_bwd(tc.chunk_gsa_triton, inputs, state), fwd_bwd(naive, inputs, state), FP32_TOL)


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("h0", [False, True])
def test_custom_op_contract(packed, h0):
    """The torch.compile path (`t2r::chunk_gsa`): schema, fake shapes (the steep-chunk lists sized by the
    chunks of packed sequences) and autograd registration hold (torch.library.opcheck)."""
    inputs, state = make(1, 150, 4, 2, **SMALL, h0=h0, n_state=2 if packed else None)
    args = [t.to(DEV).requires_grad_(t.is_floating_point()) for t in inputs.values()]
    state = [None, None] if state is None else [t.to(DEV).requires_grad_() for t in state]
    cu = torch.tensor([0, 70, 150], dtype=torch.int32, device=DEV) if packed else None
    torch.library.opcheck(tc._chunk_op, (*args, *state, cu, SMALL["K"] ** -0.5),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))
