"""The op tests' numerics: relative errors, realistic gates, forward + backward runs, inputs of the linear-attention
ops. tests/ops/conftest.py hands most of these out as fixtures (`def test_x(assert_close, forward_backward): ...`)."""

from typing import Callable

import torch
import torch.nn.functional as F

B, H, K, V, M = 2, 2, 16, 32, 8
"""The op tests' default sizes: batch, kv heads, key and value dims, GSA slots."""


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in fp64 on the CPU (0 when both are zero)."""
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    denom = ref.norm().item()
    diff = (out - ref).norm().item()
    return diff if denom == 0 else diff / denom


def assert_close(out, ref, rtol: float, name: str = "tensor") -> None:
    """Compare a tensor or a dict of tensors by relative norm error: <= rtol, all finite."""
    if isinstance(ref, dict):
        assert out.keys() == ref.keys(), f"different results: {sorted(out)} vs {sorted(ref)}"
        for key in ref:
            assert_close(out[key], ref[key], rtol, key)
        return
    assert out.shape == ref.shape, f"{name}: shape {list(out.shape)} != {list(ref.shape)}"
    assert torch.isfinite(out).all(), f"{name}: non-finite values"
    err = rel_err(out, ref)
    assert err <= rtol, f"{name}: relative error {err:.2e} > {rtol:.0e}"


def make_log_decay(shape, kind: str = "moderate") -> torch.Tensor:
    """Log-space decays (<= 0) in a realistic range.

    mild: logsigmoid(x)/16 (GLA's normaliser, decays near 1); moderate:
    logsigmoid(2x) (forgets within a few steps); strong: about -10 per step.
    """
    x = torch.randn(shape)
    if kind == "mild":
        return F.logsigmoid(x) / 16
    if kind == "moderate":
        return F.logsigmoid(2 * x)
    if kind == "strong":
        return (-10 + x).clamp(max=-5)
    raise ValueError(f"unknown gate kind {kind!r}")


def make_inputs(op: str, T: int, HQ: int = H, gate: str = "moderate", dtype=torch.float32, batch: int = B,
                seqs: int | None = None):
    """(inputs by name, initial state) of `op` at the default sizes: q [batch, T, HQ, K], k and v over H kv heads,
    and decays of `make_log_decay` kind `gate`, per key channel (gla), per head (simple_gla) or per slot (gsa,
    with write weights s and a state pair). The state has `seqs` rows (default: batch).

    GSA's write weights s are drawn apart from g: with s = 1 - exp(g) and strong decays every slot would hold the
    same key, the slot softmax would be flat and dq pure noise."""
    rows = batch if seqs is None else seqs
    inputs = {"q": torch.randn(batch, T, HQ, K), "k": torch.randn(batch, T, H, K), "v": torch.randn(batch, T, H, V)}
    if op == "gsa":
        inputs["s"] = torch.rand(batch, T, H, M) * 2
        inputs["g"] = make_log_decay((batch, T, H, M), gate)
        state = (torch.randn(rows, H, K, M), torch.randn(rows, H, M, V))
    elif op in ("gla", "simple_gla"):
        inputs["g"] = make_log_decay((batch, T, H, K) if op == "gla" else (batch, T, H), gate)
        state = torch.randn(rows, H, K, V)
    else:
        raise ValueError(f"no inputs for {op!r}: gla, simple_gla or gsa")
    return {name: t.to(dtype) for name, t in inputs.items()}, state


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_(True)


def forward_backward(fn: Callable, inputs: dict[str, torch.Tensor], initial_state=None,
                     **kwargs) -> dict[str, torch.Tensor]:
    """Run fn(*inputs, initial_state=, output_final_state=True, **kwargs), backprop fixed
    random cotangents through the output and final state, and collect everything.

    Returns fp32 tensors: 'o', 'final' (or 'final0', 'final1' for a state pair),
    'd<name>' per input and 'dh0' (or 'dh0_0', 'dh0_1') for the initial state.
    """
    leaves = {name: _leaf(t) for name, t in inputs.items()}
    pair = isinstance(initial_state, tuple)
    h0 = None
    if initial_state is not None:
        h0 = tuple(_leaf(t) for t in initial_state) if pair else _leaf(initial_state)
    o, final = fn(*leaves.values(), initial_state=h0, output_final_state=True, **kwargs)
    finals = final if isinstance(final, tuple) else (final,)
    gen = torch.Generator().manual_seed(1234)
    loss = (o.float() * torch.randn(o.shape, generator=gen)).sum()
    for f in finals:
        assert f.dtype == torch.float32, f"final state must be fp32, got {f.dtype}"
        loss = loss + (f * torch.randn(f.shape, generator=gen)).sum()
    loss.backward()

    result = {"o": o.float()}
    if len(finals) == 1:
        result["final"] = finals[0]
    else:
        result.update({f"final{i}": f for i, f in enumerate(finals)})
    result.update({f"d{name}": leaf.grad.float() for name, leaf in leaves.items()})
    if h0 is not None:
        if pair:
            result.update({f"dh0_{i}": t.grad for i, t in enumerate(h0)})
        else:
            result["dh0"] = h0.grad
    return {key: value.detach() for key, value in result.items()}


def state_rows(state, start: int, end: int):
    """Rows [start, end) of a state or of each tensor of a state pair (None passes through)."""
    if state is None:
        return None
    if isinstance(state, tuple):
        return tuple(s[start:end] for s in state)
    return state[start:end]


def repeat_heads(t: torch.Tensor | None, groups: int, dim: int = 2) -> torch.Tensor | None:
    """Repeat each kv head `groups` times (the reference way to express GQA)."""
    return None if t is None else t.repeat_interleave(groups, dim=dim)
