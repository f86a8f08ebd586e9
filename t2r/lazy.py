"""Package faces that import on first use (PEP 562): a package's `__init__` names what it exports and where
each lives; importing the package then costs nothing, so that reading a recipe or a flag needs no torch."""

from __future__ import annotations

import importlib
import importlib.util


def lazy_exports(package: str, exports: dict[str, str]):
    """(`__getattr__`, `__dir__`) for `package` whose names live in submodules: `exports` maps a name to its
    module, relative to the package (`".recipe"`) or absolute. The value is kept in the package once loaded; any
    other name that is a submodule (`t2r.convert.sensitivity`) imports it."""
    def __getattr__(name: str):
        if name not in exports:
            if importlib.util.find_spec(f"{package}.{name}") is None:  # a submodule reads as it did when eager
                raise AttributeError(f"module {package!r} has no attribute {name!r}")
            return importlib.import_module(f"{package}.{name}")
        value = getattr(importlib.import_module(exports[name], package), name)
        setattr(importlib.import_module(package), name, value)
        return value

    def __dir__():
        return sorted(set(exports) | set(vars(importlib.import_module(package))))

    return __getattr__, __dir__
