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


def test_the_triton_cache_directory_is_pinned_once_known(monkeypatch, tmp_path):
    """Inductor sets TRITON_CACHE_DIR to its own directory when unset: t2r pins Triton's first, so that its kernels
    compiled before Inductor's first (the ranking) and after it land in one directory; a directory already set
    stays."""
    import os

    import pytest

    knobs = pytest.importorskip("triton").knobs
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    default = knobs.cache.dir
    backend.one_cache_dir()
    assert os.environ["TRITON_CACHE_DIR"] == default == knobs.cache.dir
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    backend.one_cache_dir()
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path) == knobs.cache.dir


def test_finetune_asks_the_triton_check_before_anything_compiles(monkeypatch):
    """A resumed run ranks and evaluates nothing before its first step: the check (which pins the cache directory)
    came first inside a compiled graph, after Inductor had set TRITON_CACHE_DIR to its own directory, and the
    kernels of the fresh run were compiled again. `finetune` asks it before it builds anything."""
    import pytest

    from t2r.train import finetuning

    order = []
    monkeypatch.setattr(finetuning, "prepare_triton", lambda: order.append("triton check"))

    def accelerator(recipe):
        order.append("accelerator")
        raise RuntimeError("stop here")

    monkeypatch.setattr(finetuning, "_accelerator", accelerator)
    with pytest.raises(RuntimeError, match="stop here"):
        finetuning.finetune(object())
    assert order == ["triton check", "accelerator"]
