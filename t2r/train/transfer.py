"""Attention transfer (stage 1 of LoLCATs, Zhang et al. 2024), the `attention_mse` loss of a stage: each
converted attention layer learns to reproduce the output of the softmax attention it replaced, on the
source model's own hidden states. All layers train at once and independently:

    loss = mean over converted layers l of  MSE( student_l(x_l), teacher_l(x_l) )

where x_l is the input of layer l's attention in the (frozen) source model, captured by a forward hook.
Which parameters move is the stage's `trainable` (attention: q/k/v/o and the gates; gates: only what
conversion added). Each student_l is called directly; under FSDP, which gathers a layer's sharded weights only in
a forward of the wrapped model, the student's own forward runs instead, each converted attention fed x_l.
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


def shard_apart(model: nn.Module) -> None:
    """Under FSDP, each converted attention module a unit of its own as well as its decoder layer (accelerate
    wraps the classes `_no_split_modules` names): the attention_mse loss reaches an attention through its output
    alone, never its decoder layer's, and FSDP gathers a unit's weights for the backward from its outputs."""
    names = sorted({type(m).__name__ for m in model.modules() if isinstance(m, ConvertedAttention)})
    kept = list(getattr(model, "_no_split_modules", None) or [])
    model._no_split_modules = kept + [name for name in names if name not in kept]


class _Filled(Exception):
    """Raised by the last paired layer's hook inside `AttentionTargets.fill`: the teacher's forward is done."""


class AttentionTargets:
    """Forward hooks on the teacher's source attention layers: after a teacher forward (whole, or `fill`'s, cut
    after the last paired layer), `mse()` is the mean over converted layers of MSE(student_l(x_l),
    teacher_l(x_l)) on what the hooks kept (x_l, the layer's input in the teacher, and its output). `close()`
    removes the hooks. With `through_forward`, `mse` takes a call of the whole student and reads
    student_l(x_l) inside it (FSDP)."""

    def __init__(self, student: nn.Module, teacher: nn.Module, pairs=None, through_forward: bool = False):
        self.pairs = pairs if pairs is not None else layer_pairs(student, teacher)
        if not self.pairs:
            raise ValueError("attention_mse: the model has no converted layers")
        self.through_forward = through_forward
        self.captured: dict[int, tuple[dict, torch.Tensor]] = {}
        self.handles = [t.register_forward_hook(self._capture(i), with_kwargs=True) for i, _, t in self.pairs]
        self._stop_after = None  # the index whose capture ends the teacher's forward, inside `fill`

    def _capture(self, index: int):
        @torch._dynamo.disable  # not traced in a compiled layer: each layer's index would be a guard, and a graph
        def hook(module, args, kwargs, output):
            self.captured[index] = ({**kwargs, "hidden_states": args[0] if args else kwargs["hidden_states"]},
                                    output[0])
            if index == self._stop_after:
                raise _Filled
        return hook

    def fill(self, teacher: nn.Module, inputs: dict) -> None:
        """Runs the teacher's forward on `inputs` as far as its last paired attention layer: the layers after it,
        the last one's MLP and the output head compute nothing the MSE reads. Under FSDP (`through_forward`) the
        forward runs whole: cutting it short would leave the sharded units gathered. Eager where the teacher's
        layers are compiled (`train.compile`): the hooks break a compiled layer's graph in two, graphs no later stage
        uses, and a run resumed after this stage compiled the teacher's whole graph where the stopped run had kept
        the broken one, so its first step found that graph in no cache (an H100 resume, 2026-11-28)."""
        self._stop_after = None if self.through_forward else max(i for i, _, _ in self.pairs)
        try:
            with torch.compiler.set_stance("force_eager"):
                teacher(**inputs)
        except _Filled:
            pass
        finally:
            self._stop_after = None

    def _inputs(self, index: int) -> dict:
        """The keyword arguments student_l gets: x_l and the teacher's positions (the softmax mask and the KV
        cache stay with the teacher)."""
        kwargs = self.captured[index][0]
        return {"hidden_states": kwargs["hidden_states"], "attention_mask": None,
                **{k: kwargs[k] for k in _PASSED if k in kwargs}}

    def _direct(self) -> dict[int, torch.Tensor]:
        return {index: attention(**self._inputs(index))[0] for index, attention, _ in self.pairs}

    def _through(self, student_forward) -> dict[int, torch.Tensor]:
        """student_l(x_l) of every converted layer, read inside `student_forward()`: a pre-hook swaps each
        converted attention's inputs for the teacher's, a hook keeps its output."""
        outputs, handles = {}, []

        def feed(index):
            return lambda module, args, kwargs: ((), {**{k: v for k, v in kwargs.items() if k != "hidden_states"},
                                                      **self._inputs(index)})

        def keep(index):
            def hook(module, args, kwargs, output):
                outputs[index] = output[0]
            return hook

        for index, attention, _ in self.pairs:
            handles.append(attention.register_forward_pre_hook(feed(index), with_kwargs=True))
            handles.append(attention.register_forward_hook(keep(index), with_kwargs=True))
        try:
            student_forward()
        finally:
            for handle in handles:
                handle.remove()
        return outputs

    def mse(self, student_forward=None) -> torch.Tensor:
        """The mean MSE over converted layers; `student_forward` (a call of the whole student) is used when
        `through_forward` is set."""
        outputs = self._through(student_forward) if self.through_forward else self._direct()
        loss = sum(F.mse_loss(outputs[index].float(), self.captured[index][1].float()) for index, _, _ in self.pairs)
        self.captured.clear()
        return loss / len(self.pairs)

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
