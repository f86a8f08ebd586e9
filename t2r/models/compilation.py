"""Regional compilation: each decoder layer through `torch.compile`, in place.

The layers run the same code, so they share one compiled graph (one compile, however deep the model); the
mixers' Triton kernels sit inside it as torch.library custom ops, without graph breaks. Compiling the whole
model instead would compile once per distinct layer and break at the generation cache. `nn.Module.compile`
leaves parameter names and state dicts as they were, so checkpoints and saved models do not change.

Under DDP each layer's graph stays whole: a layer's backward already ends where DDP's hooks can all-reduce its
gradients, and dynamo's DDP optimizer (`optimize_ddp`), made for a model compiled whole, split the layers'
graphs again at DDP's bucket boundaries (SmolLM2's gdn hybrid on two H200s: 9 Inductor graphs where one process
has 5, and AOTAutograd's cache bypassed for the split ones, 2026-11-28).
"""

from __future__ import annotations

import torch
import torch.nn as nn

# The graphs the layers' one code object may need in a training run: teacher and student layers, converted and
# kept, training and evaluation, before and after the first dynamic shape. Dynamo's default (8) made the ninth
# fall back to eager without saying more than a warning.
RECOMPILE_LIMIT = 64


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The model's decoder layers (a causal LM, its base model, or a peft wrapper around either)."""
    for name, module in model.named_modules():
        if name.endswith("layers") and isinstance(module, nn.ModuleList) and len(module) > 0:
            return module
    raise ValueError(f"{type(model).__name__} has no decoder layers (an nn.ModuleList named 'layers')")


PACKED_OFFSETS = ("cu_seq_lens_q", "cu_seq_lens_k")
"""A packed batch's document offsets (`t2r.data.collate_packed`): one entry per document, plus one."""


PACKED_LONGEST = ("max_length_q", "max_length_k")
"""Its longest document's length (a Python int), which varlen attention takes as an upper bound."""


def any_document_count(batch: dict) -> dict:
    """`batch`, its packed offsets marked dynamic in length: the compiled layers then take a micro-batch of any
    number of documents with the graphs they have. Static, each new count compiled every layer kind's graphs
    again (5 graphs a count on a two-layer hybrid, 2026-11-27), up to the recompile limit, then eager. The
    longest document's length, an int a compiled softmax layer guards on (a graph per value), is rounded up to a
    power of two: varlen attention reads it as a bound on the documents' lengths (its grid of query blocks; the
    blocks past a document's end do nothing), so a few values cover every batch."""
    for name in PACKED_OFFSETS:
        if torch.is_tensor(batch.get(name)):
            torch._dynamo.maybe_mark_dynamic(batch[name], 0)
    for name in PACKED_LONGEST:
        if isinstance(batch.get(name), int) and batch[name] > 0:
            batch[name] = 1 << (batch[name] - 1).bit_length()
    return batch


CACHES = (("Inductor", "inductor", "fxgraph_cache_"), ("AOTAutograd", "aot_autograd", "autograd_cache_"))
"""torch.compile's two caches of compiled graphs, as `torch._dynamo.utils.counters` counts their outcomes."""


def cache_outcomes() -> str:
    """What torch.compile's graph caches did in this process so far ("" before any compile): hits load a graph a
    run compiled before (a resume's first step, seconds), misses and bypasses compile it (tens of seconds)."""
    from torch._dynamo.utils import counters

    said = []
    for name, group, prefix in CACHES:
        hit, miss, bypass = (counters[group][prefix + outcome] for outcome in ("hit", "miss", "bypass"))
        if hit + miss + bypass:
            said.append(f"{name}'s cache {hit} hit, {miss} missed, {bypass} bypassed")
    return "; ".join(said)


def compile_layers(model: nn.Module, dynamic: bool = False) -> nn.Module:
    """Every decoder layer through torch.compile (static shapes by default); returns `model`."""
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)
    # GSA's custom op returns its steep-chunk list, whose length follows a packed batch's chunk count: captured
    # with a size the graph learns when it runs, where dynamo would otherwise break the graph at each GSA layer
    config.capture_dynamic_output_shape_ops = True
    config.optimize_ddp = False  # one graph a layer under DDP too (the module's docstring)
    for layer in decoder_layers(model):
        layer.compile(dynamic=dynamic)
    return model
