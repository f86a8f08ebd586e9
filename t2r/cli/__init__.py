"""`t2r` command line: convert | finetune | run | eval | bench | generate | rank-layers | cache.

One module per command family (`convert`, `generate`, `evaluate`, `train`, `cache`), the parser in `parser`,
dispatch in `app`. Start-up imports nothing heavy (torch, transformers and the t2r modules that use them load
inside the commands), so `t2r --help`, `t2r <command> --help`, `--version` and argument errors answer at once,
and a missing local path is reported before anything loads (`t2r.paths`).
"""

from t2r.cli.app import main
from t2r.cli.parser import DTYPES, build_parser

__all__ = ["main", "build_parser", "DTYPES"]
