"""Loading what an evaluation compares: the model, and its baseline (by default the source it came from)."""

from __future__ import annotations

import sys

from t2r.dtypes import DTYPE_NAMES


def eval_dtype(name: str | None, device: str) -> str:
    """`auto` (or None): float32 on CPU, bfloat16 on GPUs."""
    if name in (None, "auto"):
        return "float32" if device == "cpu" else "bfloat16"
    if name not in DTYPE_NAMES:
        raise ValueError(f"dtype {name!r} is not one of auto, {', '.join(DTYPE_NAMES)}")
    return name


def default_baseline(model) -> str | None:
    """The source a converted model records (`config.t2r_source`), or None for a source model."""
    return getattr(model.config, "t2r_source", None)


def load_pair(model_spec: str, baseline_spec: str | None, dtype: str, device: str):
    """(model, tokenizer, baseline or None, baseline tokenizer or None, baseline spec or None).

    `baseline_spec=None` takes the model's recorded source when it loads (a note is printed when it does not);
    `"none"` compares with nothing; any other spec must load.
    """
    from t2r.sources import load_source

    model, tokenizer = load_source(model_spec, dtype=dtype, device=device)
    explicit = baseline_spec is not None
    if baseline_spec is None:
        baseline_spec = default_baseline(model)
    if baseline_spec is None or baseline_spec.lower() == "none":
        return model, tokenizer, None, None, None
    try:
        baseline, baseline_tokenizer = load_source(baseline_spec, dtype=dtype, device=device)
    except (OSError, ValueError, RuntimeError) as err:
        if explicit:
            raise
        print(f"note: the recorded source {baseline_spec!r} did not load ({err}); evaluating without a baseline "
              "(pass --baseline DIR|HUB_ID to compare)", file=sys.stderr)
        return model, tokenizer, None, None, None
    return model, tokenizer, baseline, baseline_tokenizer, baseline_spec
