"""Shared set-up of the Triton kernel tests (test_triton_*.py).

Without a GPU, tests/conftest.py sets TRITON_INTERPRET=1 before anything imports triton, so
kernel modules import normally and run in Triton's CPU interpreter (small shapes, fp32/fp16;
the interpreter computes bf16 dots wrongly, so bf16 and real sizes run on the GPU).
"""
import contextlib
import inspect
import os

import pytest
import torch

CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
DEV = "cuda" if CUDA else "cpu"


def require_triton():
    """Skip the calling test module unless triton is installed and there is a GPU or the
    interpreter is on; call it at module level before importing kernel modules."""
    triton = pytest.importorskip("triton")
    if not CUDA and not INTERPRET:
        pytest.skip("needs a GPU or TRITON_INTERPRET=1", allow_module_level=True)
    return triton


class OutOfBounds(AssertionError):
    """A kernel run by the interpreter touched memory outside every tensor it was given."""


@contextlib.contextmanager
def checked_memory():
    """Inside, each load and store of a kernel run by Triton's interpreter must fall inside one tensor passed
    to that launch (the tensor's own view, not its whole storage; all lanes of one access inside the same
    tensor); else OutOfBounds names the kernel, the access and the first bad address. The interpreter itself
    never faults on such accesses (it reads host memory), so this stands for the GPU's illegal-address error
    on CPU. Masked-off lanes, and a block pointer's lanes outside its boundary_check, are not accesses."""
    if not INTERPRET:
        yield
        return
    import numpy as np
    from triton.runtime import interpreter

    launch = {}   # the running launch: kernel name, [start, end) byte ranges of its tensors sorted by start
    init_args = interpreter.GridExecutor._init_args_hst
    load, store = interpreter.InterpreterBuilder.create_masked_load, interpreter.InterpreterBuilder.create_masked_store

    def extent(t):
        span = 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
        return t.data_ptr(), t.data_ptr() + span * t.element_size()

    def init_args_checked(self, args_dev, kwargs):
        args_hst, kwargs_hst = init_args(self, args_dev, kwargs)
        ranges = sorted(extent(a) for a in list(args_hst) + list(kwargs_hst.values())
                        if isinstance(a, torch.Tensor) and a.numel() > 0)
        launch.update(name=self.fn.__name__, lo=np.array([r[0] for r in ranges], dtype=np.uint64),
                      hi=np.array([r[1] for r in ranges], dtype=np.uint64))
        return args_hst, kwargs_hst

    def check(ptrs, mask, what):
        addr = np.broadcast_to(ptrs.data, np.shape(mask.data))[np.asarray(mask.data, dtype=bool)].ravel()
        if addr.size == 0 or "lo" not in launch:
            return
        size = np.uint64(ptrs.get_element_ty().primitive_bitwidth // 8)
        i = np.searchsorted(launch["lo"], addr, side="right").astype(np.int64) - 1   # the tensor starting last
        bad = (i < 0) | (addr + size > launch["hi"][np.maximum(i, 0)]) | (i != i[0])
        if bad.any():
            raise OutOfBounds(f"{launch['name']}: {what} of {int(bad.sum())} of {addr.size} elements outside the "
                              f"tensor its first element lies in, first at address {int(addr[bad][0]):#x}")

    def load_checked(self, ptrs, mask, other, *rest):
        check(ptrs, mask, "load")
        return load(self, ptrs, mask, other, *rest)

    def store_checked(self, ptrs, value, mask, *rest):
        check(ptrs, mask, "store")
        return store(self, ptrs, value, mask, *rest)

    interpreter.GridExecutor._init_args_hst = init_args_checked
    interpreter.InterpreterBuilder.create_masked_load = load_checked
    interpreter.InterpreterBuilder.create_masked_store = store_checked
    try:
        yield
    finally:
        interpreter.GridExecutor._init_args_hst = init_args
        interpreter.InterpreterBuilder.create_masked_load = load
        interpreter.InterpreterBuilder.create_masked_store = store


def quick_device_calls():
    """Make Triton's interpreter skip re-patching triton.language at every device-function call.

    The interpreter patches triton.language's builtins (`_patch_lang`: four `inspect.getmembers` scans, ~1 ms) when a
    kernel launches, and again at each call of a @triton.jit helper from inside the kernel, never undoing the
    latter. A second patch of a module already patched by the running launch changes nothing (the patched members
    are no longer builtins, so they are skipped, and the rest is set to the same functions), yet it took ~45% of the
    interpreted kernel tests' time (6,770 calls in one GSA forward and backward). Here a device call patches only
    the language modules the running launch has not patched yet: the kernels compute exactly what they did."""
    if not INTERPRET:
        return
    import triton.language as tl
    from triton.runtime import interpreter

    if getattr(interpreter.InterpretedFunction.__call__, "quick", False):
        return
    if not (hasattr(interpreter, "_patch_lang") and hasattr(interpreter.InterpretedFunction, "rewrite")):
        return  # another Triton than the one this mirrors (3.6): its interpreter as it is
    launch_call = interpreter.GridExecutor.__call__
    patched = []  # per running launch: ids of the language modules patched since it began

    found = {}  # function -> ids of the language modules among its globals (what _patch_lang patches)

    def languages(fn) -> frozenset:
        if fn not in found:
            found[fn] = frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))
        return found[fn]

    def launch(self, *args, **kwargs):
        patched.append(set(languages(self.fn)))  # the launch patches its kernel's own first
        try:
            return launch_call(self, *args, **kwargs)
        finally:
            patched.pop()

    def device_call(self, *args, **kwargs):
        wanted = languages(self.fn)
        if not patched or not wanted <= patched[-1]:
            interpreter._patch_lang(self.fn)
            if patched:
                patched[-1] |= wanted
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interpreter.InterpreterError(repr(e)) from e

    device_call.quick = True
    interpreter.GridExecutor.__call__ = launch
    interpreter.InterpretedFunction.__call__ = device_call
