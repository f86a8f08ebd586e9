"""Evaluation: a converted model against its source, side by side.

`evaluate()` runs perplexity by position (with training-free window baselines), synthetic recall (MQAR,
passkey), lm-eval suites and the speed/memory bench; `write_report()` writes report.md, results.json and plots.
"""

from .models import load_pair
from .report import recovered
from .report import write as write_report
from .suite import BUILTIN_SUITES, EvalSettings, evaluate

__all__ = ["BUILTIN_SUITES", "EvalSettings", "evaluate", "load_pair", "recovered", "write_report"]
