"""The optimizer of every training path (stages, `--measure`, `t2r bench --train`): AdamW with the recipe's
betas and weight decay, fused on CUDA."""

from __future__ import annotations

import torch


def build_optimizer(params, lr: float, train=None, weight_decay: float | None = None) -> torch.optim.AdamW:
    """AdamW over `params` at `lr`, with `train`'s (a `TrainSection`) betas and weight decay, or torch's
    defaults; `weight_decay` overrides the section's."""
    options = {"betas": tuple(train.betas), "weight_decay": train.weight_decay} if train is not None else {}
    if weight_decay is not None:
        options["weight_decay"] = weight_decay
    return torch.optim.AdamW(params, lr=lr, **options)
