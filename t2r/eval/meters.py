"""What the benches measure with (`t2r.eval.bench`, `t2r.eval.static_bench`): device-synchronised wall time and
the bytes of a set of tensors, each storage counted once."""

from __future__ import annotations

import time

import torch


def timed(fn, device):
    """(fn(), seconds), device-synchronised."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda device: None)
    sync(device)
    start = time.perf_counter()
    result = fn()
    sync(device)
    return result, time.perf_counter() - start


def unique_bytes(tensors) -> int:
    """Sum of numel * element_size, one tensor per storage (the largest view of it)."""
    per_storage: dict[tuple, int] = {}
    for t in tensors:
        key = (t.device, t.untyped_storage().data_ptr()) if t.numel() else ("empty", id(t))
        per_storage[key] = max(per_storage.get(key, 0), t.numel() * t.element_size())
    return sum(per_storage.values())
