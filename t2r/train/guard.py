"""Non-finite and collapsed training steps: skipped or watched, counted, and fatal when they keep coming.

`NonFiniteGuard.check` is called once per optimizer step with the loss (averaged over processes) and the
global gradient norm, which every process sees alike, so all of them skip the same steps. A skipped step
still consumes its batches and advances the schedule (resume stays exact), but changes no weight. After
`limit` skipped steps in a row the run stops with `NonFiniteError`; `weights_finite` is checked before
every save, so a non-finite model is never written.

`CollapseGuard.check` watches the finite steps for a model that has collapsed: a loss far above the stage's
first (more than doubled and at least one nat higher: `lr=1e3` sends a KL of 0.05 to 4), or a next-token
loss back at ln(vocab size), the loss of a uniform guess, after the stage had learned to do better. No
checkpoint is written while the last step looks collapsed (the last good one stays), `limit` such steps in a
row stop the run with `CollapseError`, and a held-out loss at ln(vocab) after any collapsed step keeps the
run from saving `final/` (`collapsed_model`).
"""

from __future__ import annotations

import math

import torch

from .errors import CollapseError, NonFiniteError


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


UNIFORM_MARGIN = 0.05
"""A next-token loss within this many nats of ln(vocab size) is a uniform guess."""
LEARNED_MARGIN = 0.5
"""A stage whose next-token loss went this far below ln(vocab size) had learned something to lose."""


class CollapseGuard:
    """Watches one stage's finite steps. `record` (kept in the trainer state, so a resumed run goes on
    watching) holds the stage's first loss, its best next-token loss and the collapsed steps so far."""

    def __init__(self, vocab_size: int, limit: int, record: dict, hint: str = ""):
        self.uniform, self.limit, self.record, self.hint = math.log(vocab_size), limit, record, hint
        self.in_row = 0

    def why(self, loss: float, next_token: float | None) -> str | None:
        """Why a step with this loss (and next-token part) looks collapsed, or None."""
        start, best = self.record.get("start"), self.record.get("best_next_token")
        if start is not None and loss > start + max(1.0, start):
            return f"loss {loss:.4g}, more than double the stage's first {start:.4g}"
        if (next_token is not None and best is not None and best <= self.uniform - LEARNED_MARGIN
                and next_token >= self.uniform - UNIFORM_MARGIN):
            return (f"next-token loss {next_token:.4g}, a uniform guess (ln vocab = {self.uniform:.4g}; the stage "
                    f"had reached {best:.4g})")
        return None

    def check(self, step: int, loss: float, next_token: float | None) -> str | None:
        """Record finite step `step`; None when healthy, else why it looks collapsed. CollapseError after
        `limit` collapsed steps in a row."""
        self.record.setdefault("start", loss)
        why = self.why(loss, next_token)
        if next_token is not None and why is None:
            self.record["best_next_token"] = min(next_token, self.record.get("best_next_token", math.inf))
        if why is None:
            self.in_row = 0
            return None
        self.in_row += 1
        self.record["collapsed_steps"] = self.record.get("collapsed_steps", 0) + 1
        if self.in_row >= self.limit:
            first = step - self.in_row + 1
            raise CollapseError(
                f"step {step}: {why}: the model has collapsed ({self.in_row} such steps in a row, steps "
                f"{first}-{step}; train.max_collapsed_steps={self.limit}); no checkpoint was written since step "
                f"{first - 1}, which the newest checkpoint holds, and no final model{self.hint}")
        return why


def collapsed_model(validation_loss: float, vocab_size: int, records: list[dict],
                    start: float | None = None) -> str | None:
    """Why a finished run's model is not a success: its held-out loss is a uniform guess after training saw a
    collapsed step or had learned better, or where the model before training (held-out loss `start`) did better,
    whatever the stages' losses (a KL-only stage has no next-token loss to watch); None otherwise."""
    uniform = math.log(vocab_size)
    if validation_loss < uniform - UNIFORM_MARGIN:
        return None
    if start is not None and start <= uniform - LEARNED_MARGIN:
        why = f"the model before training had {start:.4f}"
    elif any(r.get("collapsed_steps") or r.get("best_next_token", math.inf) <= uniform - LEARNED_MARGIN
             for r in records):
        why = "training saw a collapsed step"
    else:
        return None
    return (f"the held-out loss {validation_loss:.4f} is a uniform guess over the {vocab_size:,}-token vocabulary "
            f"(ln {vocab_size} = {uniform:.4f}) where {why}: the model has collapsed")
