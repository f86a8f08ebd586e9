"""Shared fixtures of the op tests: seeding, realistic gates, forward+backward runs, comparisons.

Helpers are handed out as fixtures (not imported) so test files need no
package layout: `def test_x(assert_close, forward_backward): ...`.
"""
from typing import Callable, Dict, Optional

import pytest
import torch
import torch.nn.functional as F


@pytest.fixture(autouse=True)
def _seed():
    """Every test starts from the same random state."""
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _single_thread():
    """Op tests use tiny tensors: one CPU thread is several times faster than a contended pool."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in fp64 (0 when both are zero)."""
    out, ref = out.detach().double(), ref.detach().double()
    denom = ref.norm().item()
    diff = (out - ref).norm().item()
    return diff if denom == 0 else diff / denom


def _assert_close(out, ref, rtol: float, name: str = "tensor") -> None:
    """Compare a tensor or a dict of tensors by relative norm error."""
    if isinstance(ref, dict):
        assert out.keys() == ref.keys(), f"different results: {sorted(out)} vs {sorted(ref)}"
        for key in ref:
            _assert_close(out[key], ref[key], rtol, key)
        return
    assert out.shape == ref.shape, f"{name}: shape {list(out.shape)} != {list(ref.shape)}"
    assert torch.isfinite(out).all(), f"{name}: non-finite values"
    err = rel_err(out, ref)
    assert err <= rtol, f"{name}: relative error {err:.2e} > {rtol:.0e}"


@pytest.fixture
def assert_close() -> Callable:
    """assert_close(out, ref, rtol, name=...): relative norm error <= rtol, all finite."""
    return _assert_close


def _make_log_decay(shape, kind: str = "moderate") -> torch.Tensor:
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


@pytest.fixture
def make_log_decay() -> Callable:
    """make_log_decay(shape, kind) with kind in ('mild', 'moderate', 'strong')."""
    return _make_log_decay


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_(True)


def _forward_backward(fn: Callable, inputs: Dict[str, torch.Tensor], initial_state=None,
                      **kwargs) -> Dict[str, torch.Tensor]:
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


@pytest.fixture
def forward_backward() -> Callable:
    """forward_backward(fn, inputs_dict, initial_state=None, **kwargs) -> dict of results."""
    return _forward_backward


def _split_state(state, start: int, end: int):
    """Rows [start, end) of a state or of each tensor of a state pair."""
    if state is None:
        return None
    if isinstance(state, tuple):
        return tuple(s[start:end] for s in state)
    return state[start:end]


@pytest.fixture
def state_rows() -> Callable:
    """state_rows(state, start, end): rows of a state or state pair (None passes through)."""
    return _split_state


def repeat_heads(t: Optional[torch.Tensor], groups: int, dim: int = 2) -> Optional[torch.Tensor]:
    """Repeat each kv head `groups` times (the reference way to express GQA)."""
    return None if t is None else t.repeat_interleave(groups, dim=dim)


@pytest.fixture
def repeat_kv_heads() -> Callable:
    """repeat_kv_heads(t, groups, dim=2)."""
    return repeat_heads
