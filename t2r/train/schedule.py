"""Learning-rate schedule: linear warmup, then cosine or linear decay to `min_lr_ratio` of the
peak (the GSA paper: 1K warmup steps, cosine), or constant."""

from __future__ import annotations

import math


def lr_factor(step: int, warmup_steps: int, total_steps: int, schedule: str = "cosine",
              min_lr_ratio: float = 0.1) -> float:
    """Multiplier of the peak lr for optimizer step `step` (0-based)."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    if schedule == "linear":
        decay = 1.0 - progress
    elif schedule == "cosine":
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        raise ValueError(f"unknown schedule {schedule!r}; choose cosine, linear or constant")
    return min_lr_ratio + (1.0 - min_lr_ratio) * decay
