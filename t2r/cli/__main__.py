"""`python -m t2r.cli ...` (what `accelerate launch -m t2r.cli` runs): the same as the `t2r` command."""

import sys

from t2r.cli import main

sys.exit(main())
