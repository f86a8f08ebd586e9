"""Shared fixtures of the op tests: seeding, one thread, and the helpers of tests/helpers/ops.py handed out as
fixtures: `def test_x(assert_close, forward_backward): ...`.
"""
from typing import Callable

import pytest
import torch

from tests.helpers import ops


@pytest.fixture(autouse=True)
def _seed():
    """Every test starts from the same random state."""
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _single_thread(one_thread):
    """Op tests use tiny tensors: one CPU thread is several times faster than a contended pool."""


@pytest.fixture
def assert_close() -> Callable:
    """assert_close(out, ref, rtol, name=...): relative norm error <= rtol, all finite."""
    return ops.assert_close


@pytest.fixture
def make_log_decay() -> Callable:
    """make_log_decay(shape, kind) with kind in ('mild', 'moderate', 'strong')."""
    return ops.make_log_decay


@pytest.fixture
def forward_backward() -> Callable:
    """forward_backward(fn, inputs_dict, initial_state=None, **kwargs) -> dict of results."""
    return ops.forward_backward


@pytest.fixture
def state_rows() -> Callable:
    """state_rows(state, start, end): rows of a state or state pair (None passes through)."""
    return ops.state_rows


@pytest.fixture
def repeat_kv_heads() -> Callable:
    """repeat_kv_heads(t, groups, dim=2)."""
    return ops.repeat_heads
