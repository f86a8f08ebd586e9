"""The mixer registry: one `MixerSpec` per conversion target, the only list of targets in t2r.

Conversion, the config, the generation cache, generation memory, recipe validation, the `t2r convert` flags
and the test matrices all read `MIXERS`; whatever differs per target is on its spec, its options class or its
layer class, never a list of target names elsewhere. A spec names its layer class as `"module:Class"`, imported on first
use, so reading the registry (and `t2r --help`) needs no torch.

Adding a mixer: a `ConvertedAttention` subclass (its state, cache layer and state bytes live on the class,
see `t2r.layers.base`), an options dataclass (`t2r.layers.options`), and one `register_mixer` call, here for
a built-in target or in the user's own code.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, fields

from t2r.layers.options import FoXOptions, GatedDeltaOptions, GLAOptions, GSAOptions, MixerOptions, RetNetOptions


@dataclass(frozen=True)
class MixerSpec:
    name: str
    options: type[MixerOptions]
    layer: str | type
    """The layer class, or `"module:Class"` to import it on first use."""
    constant_memory: bool
    """A fixed-size state per sequence (True), or K/V that grow with the context (False)."""
    summary: str
    """One line for the README's table of targets."""
    adds_parameters: bool = True
    """Whether a converted layer has parameters of its own (gates), trained by `train.trainable: gates`."""
    teacher_init: bool = False
    """Whether `init="teacher"` applies: the layer has learned forget gates whose decay starts from the source's
    look-back (its class implements `ConvertedAttention.init_from_lookback`)."""

    @property
    def layer_class(self) -> type:
        if isinstance(self.layer, type):
            return self.layer
        module, _, name = self.layer.partition(":")
        return getattr(importlib.import_module(module), name)

    def resolve_options(self, **overrides) -> MixerOptions:
        """This target's options with user overrides (None = default); raises ValueError naming any bad field."""
        known = self.options.field_names()
        unknown = sorted(set(overrides) - set(known))
        if unknown:
            owners = {name: [spec.name for spec in MIXERS.values() if name in spec.options.field_names()]
                      for name in unknown}
            detail = "; ".join(f"{name} is an option of {', '.join(owners[name])}" if owners[name] else
                               f"{name} is no option" for name in unknown)
            raise ValueError(f"option(s) {unknown} do not apply to {self.name} ({detail}); "
                             f"{self.name} takes {sorted(known)}")
        options = self.options(**{k: v for k, v in overrides.items() if v is not None})
        options.validate()
        return options

    def options_from_config(self, saved: dict) -> MixerOptions:
        """Options saved in a model config. Versions before per-target options saved every target's fields
        under each target; those of other targets are dropped here."""
        others = {name for spec in MIXERS.values() for name in spec.options.field_names()}
        return self.resolve_options(**{k: v for k, v in saved.items()
                                       if k in self.options.field_names() or k not in others})


MIXERS: dict[str, MixerSpec] = {}
"""Registered conversion targets by name, in registration order (the order of help texts and tables)."""


def register_mixer(spec: MixerSpec) -> MixerSpec:
    """Add a conversion target; its name must be new and must not be `softmax` (an unconverted layer)."""
    if spec.name in MIXERS or spec.name == "softmax":
        raise ValueError(f"a mixer named {spec.name!r} is already registered")
    if not (isinstance(spec.options, type) and issubclass(spec.options, MixerOptions)):
        raise TypeError(f"{spec.name}: options must be a MixerOptions subclass, got {spec.options!r}")
    MIXERS[spec.name] = spec
    return spec


def unregister_mixer(name: str) -> None:
    get_mixer(name)
    del MIXERS[name]


def get_mixer(name: str) -> MixerSpec:
    try:
        return MIXERS[name]
    except KeyError:
        raise ValueError(f"unknown mixer {name!r}: choose one of {', '.join(MIXERS)} "
                         "(or register one with t2r.layers.register_mixer)") from None


def resolve_options(target: str, **overrides) -> MixerOptions:
    return get_mixer(target).resolve_options(**overrides)


def teacher_init_targets() -> list[str]:
    """The registered targets that `init="teacher"` applies to (`MixerSpec.teacher_init`)."""
    return [name for name, spec in MIXERS.items() if spec.teacher_init]


def teacher_init_refusal(target: str) -> str:
    """The error for `init="teacher"` on a target it does not apply to."""
    return (f"init='teacher': {target} has no learned forget-gate decay to set from the source's attention "
            f"(supported: {', '.join(teacher_init_targets())})")


def option_names() -> list[str]:
    """Every option of every registered mixer, once, in order of first appearance."""
    names: dict[str, None] = {}
    for spec in MIXERS.values():
        names.update(dict.fromkeys(spec.options.field_names()))
    return list(names)


def option_field(name: str):
    """The dataclass field of option `name` that carries its help (the first registered one with help)."""
    candidates = [f for spec in MIXERS.values() for f in fields(spec.options) if f.name == name]
    return next((f for f in candidates if "help" in f.metadata), candidates[0])


register_mixer(MixerSpec(
    "gsa", GSAOptions, "t2r.layers.gsa:GatedSlotAttention", constant_memory=True,
    summary="gated slot attention: M slots per kv head read by softmax (Zhang et al. 2024)"))
register_mixer(MixerSpec(
    "gla", GLAOptions, "t2r.layers.gla:GatedLinearAttention", constant_memory=True,
    summary="gated linear attention, low-rank data-dependent decay (Yang et al. 2024)", teacher_init=True))
register_mixer(MixerSpec(
    "retnet", RetNetOptions, "t2r.layers.retnet:RetentionAttention", constant_memory=True,
    summary="retention: fixed per-head decay, no new parameter (Sun et al. 2023)", adds_parameters=False))
register_mixer(MixerSpec(
    "fox", FoXOptions, "t2r.layers.fox:ForgettingAttention", constant_memory=False,
    summary="forgetting attention: softmax with a forget gate, keeps K/V (Lin et al. 2025)", teacher_init=True))
register_mixer(MixerSpec(
    "gdn", GatedDeltaOptions, "t2r.layers.gated_delta:GatedDeltaAttention", constant_memory=True,
    summary="gated delta rule: L2-normalised keys overwrite the state (Gated DeltaNet, Yang, Kautz & Hatamizadeh 2024)",
    teacher_init=True))
