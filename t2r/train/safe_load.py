"""Loading a checkpoint runs no code stored in it.

Inside `no_code_from_disk()` every `torch.load` is made with `weights_only=True` (tensors and plain
containers only), whatever the caller asked: accelerate restores its registered custom objects with
`weights_only=False`, and torch.distributed.checkpoint (FSDP's sharded checkpoints) its non-tensor items
the same way. FSDP's `.metadata` file is a plain pickle; it is read through `RestrictedUnpickler`, which
builds only the checkpoint metadata classes, torch dtypes/sizes and builtin containers. Anything else
raises `pickle.UnpicklingError` before it is constructed, so a crafted file cannot run a command.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import pickle

import torch

SAFE_BUILTINS = {"dict", "list", "tuple", "set", "frozenset", "int", "float", "complex", "str", "bytes",
                 "bytearray", "bool", "slice", "range"}
SAFE_GLOBALS = {("collections", "OrderedDict"), ("torch", "Size"), ("torch", "device"),
                ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"),
                ("pathlib", "PurePosixPath"), ("copyreg", "_reconstructor")}
METADATA_MODULES = ("torch.distributed.checkpoint.",)


class RestrictedUnpickler(pickle.Unpickler):
    """A pickle reader that refuses every global outside a short allowlist (checkpoint metadata)."""

    def find_class(self, module: str, name: str):
        if module == "builtins" and name in SAFE_BUILTINS:
            return getattr(builtins, name)
        if (module, name) in SAFE_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.layout)):
            return getattr(torch, name)
        if module.startswith(METADATA_MODULES):
            found = super().find_class(module, name)
            if isinstance(found, type):  # metadata dataclasses and enums, never functions
                return found
        raise pickle.UnpicklingError(f"refused to unpickle {module}.{name}: a checkpoint may hold tensors and "
                                     "plain data only")


class _RestrictedPickleModule:
    """Stands in for the `pickle` module where torch.distributed.checkpoint reads metadata."""

    def __getattr__(self, name):
        return getattr(pickle, name)

    @staticmethod
    def load(file, **kwargs):
        return RestrictedUnpickler(file, **kwargs).load()

    @staticmethod
    def loads(data, **kwargs):
        return RestrictedUnpickler(io.BytesIO(data), **kwargs).load()


@contextlib.contextmanager
def no_code_from_disk():
    """Within this block, torch.load is weights-only and DCP metadata is read by `RestrictedUnpickler`."""
    original = torch.load

    def weights_only_load(*args, **kwargs):
        kwargs["weights_only"] = True
        return original(*args, **kwargs)

    patched = [(torch, "load", weights_only_load)]
    try:
        import torch.distributed.checkpoint.filesystem as dcp_fs

        patched.append((dcp_fs, "pickle", _RestrictedPickleModule()))
    except ImportError:  # torch built without distributed
        pass
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patched]
    for obj, name, value in patched:
        setattr(obj, name, value)
    try:
        yield
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)
