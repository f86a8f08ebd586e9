"""The optimizer of every training path (a recipe's stages, `--measure`, `t2r bench --train`): AdamW with the
recipe's betas and weight decay."""

from __future__ import annotations

import torch


def build_optimizer(params, lr: float, train=None, weight_decay: float | None = None,
                    fused: bool | None = None) -> torch.optim.AdamW:
    """AdamW over `params` at `lr`, with `train`'s (a recipe's `TrainSection`) betas and weight decay, or torch's
    defaults; `weight_decay` overrides the section's; `fused` as torch takes it (its device is checked at the
    first step, so parameters may move to the GPU after this)."""
    options = {"betas": tuple(train.betas), "weight_decay": train.weight_decay} if train is not None else {}
    if weight_decay is not None:
        options["weight_decay"] = weight_decay
    return torch.optim.AdamW(params, lr=lr, fused=fused, **options)
