"""Converted attention layers: each takes the source attention's projections and adds a small gate.

The registry and options import no torch; the layer classes load on first use (PEP 562), so that
`t2r.layers.registry` stays light for the command line.
"""

from t2r.layers.options import (
    FEATURE_MAPS,
    FoXOptions,
    GatedDeltaOptions,
    GLAOptions,
    GSAOptions,
    MixerOptions,
    RetNetOptions,
)
from t2r.layers.registry import MIXERS, MixerSpec, get_mixer, register_mixer, resolve_options, unregister_mixer

_LAZY = {
    "ConvertedAttention": "t2r.layers.base", "RecurrentMixer": "t2r.layers.base",
    "GatedSlotAttention": "t2r.layers.gsa", "GatedLinearAttention": "t2r.layers.gla",
    "RetentionAttention": "t2r.layers.retnet", "ForgettingAttention": "t2r.layers.fox",
    "GatedDeltaAttention": "t2r.layers.gated_delta",
    "RecurrentStateLayer": "t2r.layers.state", "GatedKVLayer": "t2r.layers.state",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 't2r.layers' has no attribute {name!r}")


def build_mixer(target: str, attention, config, layer_idx: int, options: MixerOptions):
    """Replace one softmax attention module by the `target` mixer, reusing its projections."""
    return get_mixer(target).layer_class(attention, config, layer_idx, options)


__all__ = [
    *_LAZY, "MixerOptions", "GSAOptions", "GLAOptions", "RetNetOptions", "FoXOptions", "GatedDeltaOptions",
    "FEATURE_MAPS",
    "MIXERS", "MixerSpec", "get_mixer", "register_mixer", "unregister_mixer", "resolve_options", "build_mixer",
]
