"""`python -m t2r ...`: the same as the `t2r` command (and `python -m t2r.cli`)."""

import sys

from t2r.cli import main

sys.exit(main())
