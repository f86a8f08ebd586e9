"""Attention transfer (stage 1 of LoLCATs, Zhang et al. 2024): before any next-token training, each
converted attention layer learns to reproduce the output of the softmax attention it replaced, on
the source model's own hidden states. All layers train at once and independently:

    loss = mean over converted layers l of  MSE( student_l(x_l), teacher_l(x_l) )

where x_l is the input of layer l's attention in the (frozen) source model, captured by a forward
hook. Only the converted attention modules' trainable parameters move (all of them, or with
`params="gates"` only the modules conversion added, so the pretrained q/k/v/o stay as they are);
one optimizer, its own lr.
"""

from __future__ import annotations

import contextlib
from itertools import islice
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from t2r.layers.base import ConvertedAttention

from .model_setup import new_modules

# the inputs of a converted attention module (positions: a window restarts at each packed document); the softmax
# mask and the KV cache stay with the teacher
_PASSED = ("position_embeddings", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def layer_pairs(student: nn.Module, teacher: nn.Module) -> list[tuple[int, nn.Module, nn.Module]]:
    """(index, converted attention, source attention) for every converted layer."""
    student_layers, teacher_layers = _decoder_layers(student), _decoder_layers(teacher)
    return [(i, s.self_attn, t.self_attn) for i, (s, t) in enumerate(zip(student_layers, teacher_layers))
            if isinstance(s.self_attn, ConvertedAttention)]


def _decoder_layers(model: nn.Module):
    for module in model.modules():
        layers = getattr(module, "layers", None)
        if isinstance(layers, nn.ModuleList):
            return layers
    raise ValueError(f"{type(model).__name__}: no decoder layers found")


def attention_transfer(student: nn.Module, teacher: nn.Module, batches: Iterable[dict], steps: int, lr: float,
                       reduce_grads=None, on_step=None, params: str = "attention", autocast=None) -> list[float]:
    """Train the converted attention layers of `student` to match `teacher`'s attention outputs for
    `steps` batches; returns the loss of each step. `reduce_grads(tensor)` (e.g. a mean over data-
    parallel processes) is applied to every gradient before the update. `autocast()` (mixed precision)
    is entered for each step's forward and backward, never around several steps: autocast keeps its
    low-precision copies of the weights until its outermost context exits, so later steps would compute
    with the starting weights and never see their own updates."""
    autocast = autocast or contextlib.nullcontext
    pairs = layer_pairs(student, teacher)
    if not pairs:
        raise ValueError("stages.attention_transfer: the model has no converted layers")
    if params not in ("attention", "gates"):
        raise ValueError(f"stages.attention_transfer.params: {params!r}; choose attention or gates")
    modules = [s if params == "attention" else new_modules(s) for _, s, _ in pairs]
    params = [p for m in modules for p in m.parameters() if p.requires_grad]
    if not params:
        raise ValueError("stages.attention_transfer: no trainable parameter in the converted attention layers "
                         "(train.trainable freezes them all, or params=gates on a mixer without gates)")
    targets = AttentionTargets(student, teacher, pairs)
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    losses = []
    try:
        for batch in islice(batches, steps):
            with autocast():
                with torch.no_grad():
                    teacher(**{k: v for k, v in batch.items() if k != "labels"})
                loss = targets.mse()
                loss.backward()
            if reduce_grads is not None:
                for p in params:
                    if p.grad is not None:
                        p.grad = reduce_grads(p.grad)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
            if on_step is not None:
                on_step(len(losses), losses[-1])
    finally:
        targets.close()
    return losses


class AttentionTargets:
    """Forward hooks on the teacher's source attention layers: after each teacher forward, `mse()` is the
    mean over converted layers of MSE(student_l(x_l), teacher_l(x_l)) on what the hooks kept (x_l, the
    layer's input in the teacher, and its output). `close()` removes the hooks."""

    def __init__(self, student: nn.Module, teacher: nn.Module, pairs=None):
        self.pairs = pairs if pairs is not None else layer_pairs(student, teacher)
        if not self.pairs:
            raise ValueError("attention_mse: the model has no converted layers")
        self.captured: dict[int, tuple[dict, torch.Tensor]] = {}
        self.handles = [t.register_forward_hook(self._capture(i), with_kwargs=True) for i, _, t in self.pairs]

    def _capture(self, index: int):
        def hook(module, args, kwargs, output):
            self.captured[index] = ({**kwargs, "hidden_states": args[0] if args else kwargs["hidden_states"]},
                                    output[0])
        return hook

    def mse(self) -> torch.Tensor:
        loss = 0.0
        for index, student_attention, _ in self.pairs:
            kwargs, target = self.captured[index]
            out, _ = student_attention(kwargs["hidden_states"], attention_mask=None,
                                       **{k: kwargs[k] for k in _PASSED if k in kwargs})
            loss = loss + F.mse_loss(out.float(), target.float())
        self.captured.clear()
        return loss / len(self.pairs)

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
