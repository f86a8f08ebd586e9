"""Shared fixtures of the evaluation tests."""

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """Tiny ops: intra-op threads only add contention (x100 per step on a busy 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
