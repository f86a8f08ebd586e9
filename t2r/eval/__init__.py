"""Evaluation: a converted model against its source, side by side.

`evaluate()` runs perplexity by position (with training-free window baselines), synthetic recall (MQAR,
passkey), lm-eval suites and the speed/memory bench; `write_report()` writes report.md, results.json and plots.
The names load on first use: `t2r.eval.settings` (what `t2r eval --help` reads) imports no torch.
"""

import importlib

_EXPORTS = {
    "BUILTIN_SUITES": ("settings", "BUILTIN_SUITES"), "EvalSettings": ("settings", "EvalSettings"),
    "evaluate": ("suite", "evaluate"), "load_pair": ("models", "load_pair"), "recovered": ("report", "recovered"),
    "write_report": ("report", "write"),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 't2r.eval' has no attribute {name!r}")
    module, attribute = _EXPORTS[name]
    value = getattr(importlib.import_module(f"t2r.eval.{module}"), attribute)
    globals()[name] = value
    return value
