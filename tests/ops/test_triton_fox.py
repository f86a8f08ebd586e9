"""Triton forgetting attention vs the PyTorch reference: outputs and grads of q, k, v, g.

Without a GPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set by tests/conftest.py
before triton is imported), fp32/fp16 at small shapes with tiny blocks so that every case spans
several blocks with ragged ends.  On a GPU the same cases run at real block sizes and
bf16 / fp16, plus every shipped config (``T2R_FOX_GPU_FULL=1`` adds the large shapes).
"""
import os

import pytest
import torch
import torch.nn.functional as F

from tests.helpers.ops import rel_err
from tests.helpers.triton import CUDA, INTERPRET, require_triton
from tests.helpers.triton import DEV as DEVICE

require_triton()

from t2r.ops.fox import triton_parallel as tp  # noqa: E402
from t2r.ops.fox.naive import naive_forgetting_attention  # noqa: E402


def _fix_interpreter_index():
    """Triton 3.6's interpreter holds scalars as 1-element arrays and turns them into loop
    bounds with int(array), which NumPy >= 2.4 refuses; take the element instead."""
    import numpy as np
    from triton.runtime import interpreter

    orig = interpreter._patch_lang_tensor
    if getattr(orig, "_t2r_fixed", False):
        return

    def patched(tensor, scope):
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    patched._t2r_fixed = True
    interpreter._patch_lang_tensor = patched


if INTERPRET:
    _fix_interpreter_index()


def make(B, Tq, Tk, HQ, H, K, V, dtype, seed=0, gate_shift=2.0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Tq, HQ, K, generator=gen)
    k = torch.randn(B, Tk, H, K, generator=gen)
    v = torch.randn(B, Tk, H, V, generator=gen)
    g = F.logsigmoid(torch.randn(B, Tk, HQ, generator=gen) + gate_shift)
    do = torch.randn(B, Tq, HQ, V, generator=gen)
    return [t.to(DEVICE) for t in (q, k, v, g, do)], dtype


def run(fn, q, k, v, g, do, dtype, **kw):
    ins = [t.to(dtype).detach().requires_grad_(True) for t in (q, k, v)] + [g.detach().float().requires_grad_(True)]
    o = fn(*ins, **kw)
    o.backward(do.to(o.dtype))
    return [o.float()] + [t.grad.float() for t in ins]


def check(shape, dtype, tol, seed=0, cu_seqlens=None, mask=None, gate_shift=2.0):
    (q, k, v, g, do), _ = make(*shape, dtype=dtype, seed=seed, gate_shift=gate_shift)
    kw = dict(cu_seqlens=cu_seqlens, attention_mask=mask)
    got = run(tp.parallel_forgetting_attention_triton, q, k, v, g, do, dtype, **kw)
    # reference in fp32 (on inputs rounded to the kernel's dtype)
    ref = run(naive_forgetting_attention, *(t.to(dtype).float() for t in (q, k, v)), g, do, torch.float32, **kw)
    for name, a, b in zip(("o", "dq", "dk", "dv", "dg"), got, ref):
        assert torch.isfinite(a).all(), f"{name} has non-finite values"
        e = rel_err(a, b)
        assert e < tol, f"{name}: rel err {e:.2e} >= {tol:.0e} ({shape}, {dtype})"


if INTERPRET:
    DTYPES = [(torch.float32, 1e-4), (torch.float16, 5e-3)]
    # (B, Tq, Tk, HQ, H, K, V)
    SHAPES = [
        (2, 45, 45, 4, 2, 16, 16),    # ragged length, GQA 2
        (1, 7, 50, 2, 1, 32, 16),     # decode-like Tq < Tk, GQA 2, K != V
        (1, 1, 37, 3, 3, 16, 32),     # single query
        (1, 33, 33, 2, 2, 64, 64),    # MHA, larger dims
    ]
else:
    DTYPES = [(torch.bfloat16, 2e-2), (torch.float16, 5e-3)]
    SHAPES = [
        (2, 1000, 1000, 8, 2, 128, 128),
        (2, 300, 1111, 9, 3, 64, 64),     # SmolLM2 heads, Tq < Tk
        (1, 1, 777, 4, 1, 128, 128),      # one query against a cache
        (3, 515, 515, 6, 6, 64, 128),     # K != V
        (2, 515, 515, 4, 2, 32, 32),
    ]


@pytest.mark.parametrize("dtype,tol", DTYPES, ids=lambda x: str(x))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_reference(shape, dtype, tol):
    if INTERPRET and dtype == torch.float16 and shape[5] > 32:
        pytest.skip("keep the interpreter run short")
    check(shape, dtype, tol)


@pytest.mark.parametrize("dtype,tol", DTYPES[:1])
def test_cu_seqlens(dtype, tol):
    T = 70 if INTERPRET else 3000
    cuts = [0, 13, 40, 41, 70] if INTERPRET else [0, 5, 1000, 1001, 2048, 3000]
    cu = torch.tensor(cuts, dtype=torch.int32, device=DEVICE)
    check((1, T, T, 4, 2, 32, 32) if INTERPRET else (1, T, T, 8, 2, 128, 128), dtype, tol, cu_seqlens=cu)


@pytest.mark.parametrize("dtype,tol", DTYPES[:1])
def test_attention_mask(dtype, tol):
    B, T = 3, (40 if INTERPRET else 700)
    mask = torch.ones(B, T, dtype=torch.long, device=DEVICE)
    mask[0, :7] = 0          # left padding
    mask[1, : T // 2] = 0    # half padded: early rows see no key
    mask[2, 5:9] = 0         # holes in the middle
    shape = (B, T, T, 4, 2, 32, 32) if INTERPRET else (B, T, T, 8, 2, 128, 128)
    check(shape, dtype, tol, mask=mask)
    # decode with a padded cache
    shape = (B, 5, T, 4, 2, 32, 32) if INTERPRET else (B, 5, T, 8, 2, 128, 128)
    check(shape, dtype, tol, mask=mask, seed=1)


def test_fp32():
    """fp32 runs in the interpreter; on the GPU the kernel declines it (the op falls back)."""
    shape = (2, 45, 45, 4, 2, 16, 16) if INTERPRET else (2, 100, 100, 8, 2, 128, 128)
    if INTERPRET:
        check(shape, torch.float32, 1e-4)
    else:
        (q, k, v, g, _), _ = make(*shape, dtype=torch.float32)
        assert not tp.supports(q, k, v, g)
        with pytest.raises(ValueError):
            tp.parallel_forgetting_attention_triton(q, k, v, g)


def test_strong_decay():
    """Gates far below 0: most weights underflow, the recent keys dominate."""
    dtype, tol = DTYPES[0]
    shape = (1, 40, 40, 2, 1, 32, 32) if INTERPRET else (2, 2048, 2048, 8, 2, 128, 128)
    check(shape, dtype, tol, gate_shift=-3.0)


@pytest.mark.parametrize("fuse", [1] if INTERPRET else [1, 2])
def test_fused_dq(fuse):
    """The backward variant whose dkv kernel also adds dq into an fp32 buffer (no dq kernel)."""
    dtype, tol = DTYPES[0]
    old = tp.CONFIG_OVERRIDE
    D = 32 if INTERPRET else 128
    tp.CONFIG_OVERRIDE = dict(tp._config(D), fuse_dq=fuse)
    try:
        check((2, 45, 45, 4, 2, 16, 16) if INTERPRET else (2, 777, 777, 8, 2, 128, 128), dtype, tol)
        check((1, 7, 50, 2, 1, 32, 16) if INTERPRET else (1, 100, 1300, 4, 1, 128, 128), dtype, tol, seed=1)
        cu = torch.tensor([0, 13, 40, 41, 70] if INTERPRET else [0, 3, 700, 1500], dtype=torch.int32, device=DEVICE)
        T = 70 if INTERPRET else 1500
        check((1, T, T, 4, 2, 32, 32) if INTERPRET else (1, T, T, 4, 2, 128, 128), dtype, tol, cu_seqlens=cu)
    finally:
        tp.CONFIG_OVERRIDE = old


@pytest.mark.skipif(not CUDA, reason="config sweep runs on the GPU")
@pytest.mark.parametrize("d", sorted(tp._CONFIGS))
def test_shipped_configs(d):
    """Every shipped config, bf16, ragged lengths, GQA, decode, packed documents."""
    old = tp.CONFIG_OVERRIDE
    tp.CONFIG_OVERRIDE = tp._CONFIGS[d]
    try:
        for shape in [(2, 777, 777, 8, 2, d, d), (1, 100, 1300, 4, 1, d, d)]:
            check(shape, torch.bfloat16, 2e-2, seed=d)
        cu = torch.tensor([0, 3, 700, 1500], dtype=torch.int32, device=DEVICE)
        check((1, 1500, 1500, 4, 2, d, d), torch.bfloat16, 2e-2, cu_seqlens=cu)
    finally:
        tp.CONFIG_OVERRIDE = old


@pytest.mark.skipif(not (CUDA and os.environ.get("T2R_FOX_GPU_FULL") == "1"), reason="large shapes on request")
@pytest.mark.parametrize("shape", [(1, 4096, 4096, 32, 8, 128, 128), (1, 8192, 8192, 9, 3, 64, 64)])
def test_large(shape):
    check(shape, torch.bfloat16, 2e-2)


def test_dispatch(monkeypatch):
    """t2r.ops.fox.forgetting_attention runs this kernel when the Triton backend is picked."""
    from t2r.ops.fox import forgetting_attention

    if INTERPRET:
        monkeypatch.setenv("T2R_OPS_BACKEND", "triton")
    (q, k, v, g, _), dtype = make(1, 40, 40, 4, 2, 32, 32, DTYPES[0][0])
    q, k, v = (t.to(dtype) for t in (q, k, v))
    calls = []
    real = tp.ForgettingAttentionFunction.apply
    monkeypatch.setattr(tp.ForgettingAttentionFunction, "apply", lambda *a: calls.append(1) or real(*a))
    o = forgetting_attention(q, k, v, g)
    assert calls, "the dispatcher did not call the Triton kernel"
    ref = naive_forgetting_attention(q.float(), k.float(), v.float(), g)
    assert rel_err(o.float(), ref) < DTYPES[0][1]


@pytest.mark.parametrize("layout", ["plain", "packed", "padded"])
def test_custom_op_contract(layout):
    """The torch.compile path (`t2r::forgetting_attention`): schema, fake shapes and autograd registration hold
    (torch.library.opcheck), with packed documents and with a padding mask."""
    B = 1 if layout == "packed" else 2
    T, HQ, H, D = 40, 4, 2, 16
    q = torch.randn(B, T, HQ, D, device=DEVICE, requires_grad=True)
    k, v = (torch.randn(B, T, H, D, device=DEVICE, requires_grad=True) for _ in range(2))
    g = F.logsigmoid(torch.randn(B, T, HQ, device=DEVICE)).requires_grad_(True)
    cu = torch.tensor([0, 15, 40], dtype=torch.int32, device=DEVICE) if layout == "packed" else None
    mask = None
    if layout == "padded":
        mask = torch.ones(B, T, dtype=torch.long, device=DEVICE)
        mask[0, :7] = 0
    torch.library.opcheck(tp._attention_op, (q, k, v, g, cu, mask, D ** -0.5),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))
