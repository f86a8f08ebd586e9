"""`t2r` with one workaround for stage 1 (attention transfer) under mixed precision, for the issue-19 runs:
`python benchmarks/repro/t2r_stage1_fix.py finetune|run --config RECIPE [section.field=value ...]`.

The bug (t2r/train/loop.py at 982a3a3): `attention_transfer` runs all its steps inside ONE
`accelerator.autocast()` context. Autocast caches the bf16 cast of every weight that requires grad until the
outermost autocast context exits, so every forward of stage 1 reuses the casts of the initial weights: the
optimizer updates the fp32 master weights, but the MSE is always computed (and differentiated) at the starting
point. Stage 1 then never sees its own updates; AdamW moves each weight by about lr x sign(first gradient) per
step, blindly, 100 times (the "damage" of round 1: MSE rising 3.83 -> 4.26, KL after stage 1 11.1 vs 5.4 for a
fresh conversion). On a CPU, bf16 autocast, the same batch three times: MSE 3.431, 3.431, 3.431 (cache on) vs
3.431, 2.624, 2.129 (cache off). The fix in t2r is one line (autocast per step, or cache_enabled=False); until
it lands, this wrapper clears the autocast cache after each stage-1 optimizer step (attention_transfer's
on_step hook runs right after optimizer.step()). It changes nothing else: runs without stage 1 are identical.
"""

import sys

import torch

import t2r.train.loop as loop
from t2r.cli import main

_transfer = loop.attention_transfer


def attention_transfer(*args, on_step=None, **kwargs):
    def step_done(step, loss):
        torch.clear_autocast_cache()  # the next forward casts the updated weights
        if on_step is not None:
            on_step(step, loss)
    return _transfer(*args, on_step=step_done, **kwargs)


loop.attention_transfer = attention_transfer

if __name__ == "__main__":
    print("t2r_stage1_fix: stage 1 clears the autocast cast cache after each step", file=sys.stderr)
    sys.exit(main())
