"""Converted attention layers: each takes the source attention's projections and adds a small gate."""

from t2r.layers.base import ConvertedAttention
from t2r.layers.fox import ForgettingAttention
from t2r.layers.gla import GatedLinearAttention
from t2r.layers.gsa import GatedSlotAttention
from t2r.layers.options import FEATURE_MAPS, MIXERS, MixerOptions
from t2r.layers.retnet import RetentionAttention

MIXER_CLASSES = {
    "gsa": GatedSlotAttention,
    "gla": GatedLinearAttention,
    "retnet": RetentionAttention,
    "fox": ForgettingAttention,
}

RECURRENT_MIXERS = ("gsa", "gla", "retnet")
"""Mixers with a fixed-size state (constant memory per sequence); FoX keeps K/V."""


def build_mixer(target: str, attention, config, layer_idx: int, options: MixerOptions) -> ConvertedAttention:
    """Replace one softmax attention module by the `target` mixer, reusing its projections."""
    return MIXER_CLASSES[target](attention, config, layer_idx, options)


__all__ = [
    "ConvertedAttention", "ForgettingAttention", "GatedLinearAttention", "GatedSlotAttention", "RetentionAttention",
    "MixerOptions", "MIXERS", "FEATURE_MAPS", "MIXER_CLASSES", "RECURRENT_MIXERS", "build_mixer",
]
