"""`t2r.ops.backend`: whether an op runs its Triton kernel, asked inside compiled code without warnings."""

import warnings

import torch

from t2r.ops import backend


def test_the_triton_check_is_asked_once_and_compiles_without_a_warning(monkeypatch):
    """The check ran through `functools.lru_cache`, which torch.compile traces through with a UserWarning in every
    compiled run's log; it is asked once a process."""
    monkeypatch.setattr(backend, "_IMPORTABLE", [])
    calls = []
    monkeypatch.setattr(backend, "_check_triton", lambda: calls.append(1) or True)

    def step(x):
        return x + 1 if backend._triton_importable() else x - 1

    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = torch.compile(step, backend="eager", fullgraph=True)(torch.zeros(3))
        backend._triton_importable()
    assert torch.equal(out, torch.ones(3)) and calls == [1]
    assert not [w for w in seen if "lru_cache" in str(w.message)], [str(w.message) for w in seen]
