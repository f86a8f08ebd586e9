"""`t2r` with DDP's constructor given extra keyword arguments, for A/B runs of options no recipe field names.

    DDP_OPTIONS='{"static_graph": true}' accelerate launch --config_file recipes/accelerate/ddp-2gpu.yaml \\
        benchmarks/repro/ddp_options.py finetune --config R.yaml ...      # two_cards.sh ddp does this when set

DDP_OPTIONS is JSON (a dict of `torch.nn.parallel.DistributedDataParallel` arguments); they override what
accelerate passes. The rest of the command line is `t2r`'s.
"""

import json
import os
import runpy

import torch.nn.parallel

options = json.loads(os.environ.get("DDP_OPTIONS") or "{}")
if not isinstance(options, dict):
    raise SystemExit(f"DDP_OPTIONS must be a JSON object of DistributedDataParallel's arguments, not {options!r}")
_init = torch.nn.parallel.DistributedDataParallel.__init__


def _init_with_options(self, *args, **kwargs):
    _init(self, *args, **{**kwargs, **options})


torch.nn.parallel.DistributedDataParallel.__init__ = _init_with_options
if options:
    print(f"ddp_options: DistributedDataParallel gets {options}", flush=True)
runpy.run_module("t2r.cli", run_name="__main__", alter_sys=True)
