"""A stage's loss: a weighted sum of the next-token loss, T^2 KL(teacher || student) on temperature-softened
distributions (Hinton et al. 2015) and the attention MSE of each converted layer against its source layer
(`t2r.train.transfer.AttentionTargets`). The softmax layers of both models read a packed batch's documents by
varlen FlashAttention on CUDA (`t2r.models.packed_attention`).

With `fused` (the default, `train.fused_kl`), a stage with a KL part never holds either model's logits for a
whole micro-batch: both output heads hand back their input (the final hidden states) and `t2r.train.kl`
computes the KL, and the next-token loss beside it, chunk by chunk over tokens."""

from __future__ import annotations

import contextlib
from functools import partial

import torch
import torch.nn.functional as F

from t2r.models.packed_attention import packed_attention

from .kl import chunked_distill_losses, shift_labels


def distill_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(teacher || student) per token on temperature-softened distributions (without the T^2 factor)."""
    t = temperature
    student = F.log_softmax(student_logits.float().flatten(0, -2) / t, -1)
    target = F.log_softmax(teacher_logits.float().flatten(0, -2) / t, -1)
    return F.kl_div(student, target, log_target=True, reduction="batchmean")


@contextlib.contextmanager
def hidden_states_as_logits(model):
    """Inside, `model(...).logits` are the final hidden states its output head reads: the head hands back its
    input without computing the [tokens, vocabulary] product (2 x tokens x hidden x vocabulary FLOPs and a
    logits tensor a forward that nobody reads); yields the head (read its weight after the forward: under FSDP2
    that is when the head's unit holds it whole). `model` may be wrapped (DDP's `module`, peft)."""
    while hasattr(model, "module"):
        model = model.module
    head = model.get_output_embeddings()
    head.forward = _hand_back  # an instance attribute shadows the class's forward until deleted
    try:
        yield head
    finally:
        del head.forward


def _hand_back(hidden_states: torch.Tensor) -> torch.Tensor:
    return hidden_states


def whole_weight(head: torch.nn.Module) -> torch.Tensor:
    """An output head's whole weight, after the forward. Under FSDP2 accelerate groups the head with the final
    norm in a unit that stays gathered after the forward; a unit resharded after it is gathered again here, by
    FSDP (whose backward then reduce-scatters the weight's gradient with the rest)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    if isinstance(head.weight, DTensor) and isinstance(head, FSDPModule):
        head.unshard()
    if isinstance(head.weight, DTensor):
        raise ValueError("the output head's weight is sharded outside FSDP2's unit: set train.fused_kl=false")
    return head.weight


def stage_loss(model, teacher, targets, stage, autocast, fused: bool = False):
    """batch -> (sum of weight x part, {part: detached 0-d tensor}) for `stage` (nothing read back to the host:
    the step loop reads a whole step's sums once); the kl part is T^2 KL(teacher || student),
    the attention_mse part `targets.mse(...)` after the teacher's forward filled its hooks. With `fused`, the kl
    part (and the next-token part beside it) come from `t2r.train.kl`, chunk by chunk."""
    weights = {name: w for name, w in stage.loss.items() if w}
    t = stage.temperature

    def fused_parts(batch: dict, inputs: dict) -> dict:
        with torch.no_grad(), hidden_states_as_logits(teacher) as teacher_head:
            teacher_hidden = teacher(**inputs).logits
            teacher_weight = whole_weight(teacher_head)
        with hidden_states_as_logits(model) as student_head:
            hidden = model(**inputs).logits
            student_weight = whole_weight(student_head)  # after the forward: FSDP2 gathered it there
        labels = shift_labels(batch["labels"]) if "next_token" in weights else None
        kl, next_token = chunked_distill_losses(hidden, student_weight, teacher_hidden, teacher_weight,
                                                temperature=t, labels=labels)
        return {"next_token": next_token, "kl": kl} if next_token is not None else {"kl": kl}

    def loss(batch: dict):
        parts = {}
        inputs = {k: v for k, v in batch.items() if k != "labels"}  # the forwards' arguments, without the loss's
        student_forward = partial(model, **inputs)  # for FSDP's mse
        # a packed batch's softmax layers (the teacher's, the student's kept ones) by varlen FlashAttention
        packed = packed_attention(model, teacher) if "attention_mask" not in batch else contextlib.nullcontext()
        for key in ("cu_seq_lens_q", "cu_seq_lens_k"):  # compiled layers: one graph for any number of documents
            if key in batch:
                torch._dynamo.maybe_mark_dynamic(batch[key], 0)
        with autocast(), packed:
            if fused and "kl" in weights:
                parts.update(fused_parts(batch, inputs))
                if targets is not None:  # the teacher's forward above filled the hooks
                    parts["attention_mse"] = targets.mse(student_forward)
                total = sum(weights[name] * value for name, value in parts.items())
                return total, {name: value.detach().float() for name, value in parts.items()}
            if "kl" in weights:
                with torch.no_grad():
                    target = teacher(**inputs).logits
            elif targets is not None:  # attention MSE alone: the teacher's forward only as far as the hooks read
                with torch.no_grad(), hidden_states_as_logits(teacher):
                    targets.fill(teacher, inputs)
            if "next_token" in weights or "kl" in weights:
                out = model(**batch)
                if "next_token" in weights:
                    parts["next_token"] = out.loss
                if "kl" in weights:
                    parts["kl"] = t * t * distill_kl(out.logits, target, t)
            if targets is not None:
                parts["attention_mse"] = targets.mse(student_forward)
        total = sum(weights[name] * value for name, value in parts.items())
        return total, {name: value.detach().float() for name, value in parts.items()}

    return loss
