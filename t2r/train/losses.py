"""A stage's loss: a weighted sum of the next-token loss, T^2 KL(teacher || student) on temperature-softened
distributions (Hinton et al. 2015) and the attention MSE of each converted layer against its source layer
(`t2r.train.transfer.AttentionTargets`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def distill_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(teacher || student) per token on temperature-softened distributions (without the T^2 factor)."""
    t = temperature
    student = F.log_softmax(student_logits.float().flatten(0, -2) / t, -1)
    target = F.log_softmax(teacher_logits.float().flatten(0, -2) / t, -1)
    return F.kl_div(student, target, log_target=True, reduction="batchmean")


def stage_loss(model, teacher, targets, stage, autocast):
    """batch -> (sum of weight x part, {part: value}) for `stage`; the kl part is T^2 KL(teacher || student),
    the attention_mse part `targets.mse()` after the teacher's forward filled its hooks."""
    weights = {name: w for name, w in stage.loss.items() if w}
    t = stage.temperature

    def loss(batch: dict):
        parts = {}
        with autocast():
            if "kl" in weights or targets is not None:
                with torch.no_grad():
                    target = teacher(**{k: v for k, v in batch.items() if k != "labels"}).logits
            if "next_token" in weights or "kl" in weights:
                out = model(**batch)
                if "next_token" in weights:
                    parts["next_token"] = out.loss
                if "kl" in weights:
                    parts["kl"] = t * t * distill_kl(out.logits, target, t)
            if targets is not None:
                parts["attention_mse"] = targets.mse()
        total = sum(weights[name] * value for name, value in parts.items())
        return total, {name: value.detach().float().item() for name, value in parts.items()}

    return loss
