"""Non-finite training steps: skipped, counted, and fatal when they keep coming.

`NonFiniteGuard.check` is called once per optimizer step with the loss (averaged over processes) and the
global gradient norm, which every process sees alike, so all of them skip the same steps. A skipped step
still consumes its batches and advances the schedule (resume stays exact), but changes no weight. After
`limit` skipped steps in a row the run stops with `NonFiniteError`; `weights_finite` is checked before
every save, so a non-finite model is never written.
"""

from __future__ import annotations

import math

import torch

from .errors import NonFiniteError


class NonFiniteGuard:
    def __init__(self, limit: int, hint: str = ""):
        self.limit, self.hint = limit, hint
        self.in_row = 0  # consecutive skipped steps
        self.total = 0  # skipped steps in this process's part of the run

    def check(self, step: int, loss: float, grad_norm: float) -> bool:
        """True if optimizer step `step` (1-based) may update the weights; False to skip it."""
        if math.isfinite(loss) and math.isfinite(grad_norm):
            self.in_row = 0
            return True
        self.in_row += 1
        self.total += 1
        if self.in_row >= self.limit:
            first = step - self.in_row + 1
            steps = f"step {step}" if first == step else f"steps {first}-{step}"
            raise NonFiniteError(
                f"step {step}: loss {loss}, gradient norm {grad_norm}: {self.in_row} non-finite steps in a row "
                f"({steps}, updates skipped; train.max_nonfinite_steps={self.limit}); the weights, and every "
                f"checkpoint since, are those after step {first - 1}{self.hint}")
        return False


def weights_finite(model, accelerator) -> bool:
    """True when every parameter on every process is finite."""
    local = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    if accelerator.num_processes == 1:
        return local
    flag = torch.tensor(0.0 if local else 1.0, device=accelerator.device)
    return accelerator.reduce(flag, "sum").item() == 0
