"""t2r: turn pretrained Transformers (Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma 3) into linear-time RNNs.

`import t2r` registers the converted model types with transformers' Auto classes, so a converted
model saved with `save_pretrained` loads back through `AutoModelForCausalLM.from_pretrained(dir)`.
The `t2r` command skips that import (torch and transformers, seconds) at start-up: its subcommands import
what they use, so `t2r --help` answers at once; the names below then load on first access. (Registering
needs transformers' Auto classes, whose import alone loads torch; Python runs this file before `t2r.cli`, so the
command line can only stay light by this test of the process.)
"""

import importlib
import os
import sys

from t2r.version import __version__  # noqa: F401 (t2r.__version__)

_EXPORTS = {
    "ARCHITECTURES": "t2r.models", "T2RCache": "t2r.models", "MIXERS": "t2r.layers", "MixerOptions": "t2r.layers",
    "MixerSpec": "t2r.layers", "register_mixer": "t2r.layers", "register_source": "t2r.models",
    "ConversionReport": "t2r.convert", "conversion_report": "t2r.convert", "convert": "t2r.convert",
    "t2r_config": "t2r.convert", "save_converted": "t2r.model_dir", "save_adapter": "t2r.model_dir",
}

__all__ = [
    "ARCHITECTURES", "ConversionReport", "MIXERS", "MixerOptions", "MixerSpec", "T2RCache", "register_mixer",
    "register_source", "conversion_report", "convert", "ops", "save_adapter", "save_converted", "t2r_config",
]


_SUBPACKAGES = ("data", "eval", "layers", "models", "ops", "sources", "train")
"""Reached as attributes after `import t2r` (`t2r.eval.evaluate(...)`), imported on first use."""


def __getattr__(name: str):
    if name in _SUBPACKAGES:
        return importlib.import_module(f"t2r.{name}")
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value  # also replaces the submodule `t2r.convert` by the function of that name
        return value
    raise AttributeError(f"module 't2r' has no attribute {name!r}")


def _in_command_line() -> bool:
    """True in the process of the `t2r` console script (its argv[0] is the script) or of `python -m t2r` /
    `python -m t2r.cli` (read from the interpreter's own arguments: argv[0] is "-m" while this imports)."""
    if os.path.basename(sys.argv[0] if sys.argv else "").lower().removesuffix(".exe") == "t2r":
        return True
    given = getattr(sys, "orig_argv", [])
    return any(a == "-m" and b in ("t2r", "t2r.cli") for a, b in zip(given, given[1:]))


if not _in_command_line():
    from t2r import ops  # noqa: E402
    from t2r.convert import ConversionReport, conversion_report, convert, t2r_config  # noqa: E402
    from t2r.layers import MIXERS, MixerOptions, MixerSpec, register_mixer  # noqa: E402
    from t2r.model_dir import save_adapter, save_converted  # noqa: E402
    from t2r.models import ARCHITECTURES, T2RCache, register_source  # noqa: E402
