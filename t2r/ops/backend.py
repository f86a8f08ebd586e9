"""Backend choice for the ops: Triton kernels on GPU, the PyTorch forms elsewhere.

The environment variable ``T2R_OPS_BACKEND`` overrides the automatic choice:

* ``triton``: always use the Triton kernels (fails loudly if they cannot run),
* ``torch``: always use the PyTorch chunkwise/recurrent forms,
* ``auto`` or unset: Triton only when the tensors live on CUDA, triton imports, and the first
  tensor (the queries) is bf16 or fp16. fp32 inputs take the PyTorch forms: Triton computes fp32
  dots in tf32, and through a whole converted model that gave weight gradients 2e-2 away from the
  fp32 PyTorch forms on an H100 (exact fp32 through the CPU interpreter agrees to 1e-6), so fp32
  stays the exact path. Force ``triton`` to run the kernels in fp32 anyway.

Under ``torch.compile`` the training kernels run as custom ops inside the graph (``t2r::chunk_linear_attn``
for GLA and simple GLA, ``t2r::chunk_gsa``, ``t2r::forgetting_attention``, each with its backward, which
recomputes what the autograd Function would have saved: chunk states, gate cumsums); eager calls keep the
Functions. The recurrent decode kernels stay opaque (``torch.compiler.disable``). The code around them
compiles (inductor fuses the norms, rotary, gate arithmetic and casts of a layer).
``benchmarks/bench_train.py --modes compiled`` measures it with regional compilation (each decoder layer
compiled once, shared by all layers); ``benchmarks/graph_break_cost.py`` what a break costs.
"""
import os
import warnings

import torch

__all__ = ["use_triton", "BACKEND_ENV"]

BACKEND_ENV = "T2R_OPS_BACKEND"
_CHOICES = ("auto", "triton", "torch")


SUPPORTED_TRITON = ((3, 6), (3, 9))
"""[low, high) triton versions the kernels run on: block pointers are gone from 3.9."""


_IMPORTABLE: list[bool] = []  # the answer of `_triton_importable`, once known


def _triton_importable() -> bool:
    """triton imports and is a version the kernels support (else the PyTorch forms run, with a warning). Asked
    once a process; a list, not `functools.lru_cache`, which torch.compile traces through with a warning in every
    compiled run's log."""
    if not _IMPORTABLE:
        _IMPORTABLE.append(_check_triton())
    return _IMPORTABLE[0]


def _check_triton() -> bool:
    try:
        import triton
    except ImportError:
        return False
    version = tuple(int(part) for part in triton.__version__.split(".")[:2])
    if not SUPPORTED_TRITON[0] <= version < SUPPORTED_TRITON[1]:
        warnings.warn(
            f"triton {triton.__version__} is outside the supported range {SUPPORTED_TRITON}: t2r uses its "
            "PyTorch ops instead of its kernels (pip install 'triton>=3.6,<3.9')", stacklevel=4,
        )
        return False
    one_cache_dir()
    return True


def prepare_triton() -> bool:
    """Whether t2r's kernels can run (`_triton_importable`), asked up front: it pins the Triton cache directory
    (`one_cache_dir`) before anything compiles. Asked first inside a compiled graph (a resumed run ranks nothing
    and evaluates nothing before its first step), the check came after Inductor had chosen its own directory, so
    the kernels the fresh run kept were compiled again (the resumed first step 39.0 s on an H100, 2026-11-27),
    and Dynamo broke the graph on Triton's `getenv`."""
    return _triton_importable()


def one_cache_dir() -> None:
    """Pins the process's Triton cache directory to the one it is now (TRITON_CACHE_DIR unset: Triton's own,
    ~/.triton/cache). Inductor sets TRITON_CACHE_DIR to a directory of its own when it makes its first kernel, if
    unset: t2r's kernels compiled before that (the layer ranking, the held-out loss) went to Triton's directory
    and those after to Inductor's, so a resumed run, which ranks nothing, compiled again what the fresh run had
    kept in the other one (the resumed first step, 18.2 s on an H100 against 4.8 s where both were warm)."""
    from triton import knobs

    os.environ.setdefault("TRITON_CACHE_DIR", knobs.cache.dir)


def use_triton(*tensors: torch.Tensor) -> bool:
    """True when the op should run its Triton kernel on these tensors."""
    choice = os.environ.get(BACKEND_ENV, "auto").strip().lower() or "auto"
    if choice not in _CHOICES:
        raise ValueError(
            f"{BACKEND_ENV}={choice!r} is not a known backend; set it to one of {_CHOICES}"
        )
    if choice != "auto":
        return choice == "triton"
    on_cuda = all(t.is_cuda for t in tensors if isinstance(t, torch.Tensor))
    # len(): bool(tuple) breaks torch.compile's graph
    half = len(tensors) > 0 and tensors[0].dtype in (torch.bfloat16, torch.float16)
    return half and on_cuda and _triton_importable()
