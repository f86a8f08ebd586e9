"""Attention transfer (stage 1 of LoLCATs, Zhang et al. 2024), the `attention_mse` loss of a stage: each
converted attention layer learns to reproduce the output of the softmax attention it replaced, on the
source model's own hidden states. All layers train at once and independently:

    loss = mean over converted layers l of  MSE( student_l(x_l), teacher_l(x_l) )

where x_l is the input of layer l's attention in the (frozen) source model, captured by a forward hook.
Which parameters move is the stage's `trainable` (attention: q/k/v/o and the gates; gates: only what
conversion added).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from t2r.layers.base import ConvertedAttention

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
