"""Options of the converted mixers: one dataclass per target, validated once, saved in the model config as a dict.

This module imports neither torch nor transformers: `t2r --help` builds the `t2r convert` flags from these
classes (their fields, defaults and `help` metadata). A new mixer may define its options class next to its
layer instead; the built-in ones live here so the command line stays light.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import ClassVar

from t2r.settings import check_value, field_meta, setting

FEATURE_MAPS = ("identity", "relu", "swish", "elu1")
_FIELD_TYPES = {"str": str, "bool": bool, "int": int, "float": (int, float)}


MAX_COUNT = 2**16
"""Upper bound of counts (slots, ranks, sinks): far beyond any sane value, so a typo (1e30) fails at once."""
MAX_WINDOW = 2**24


def option(default, help: str, **checks):
    """A `t2r.settings.setting` whose `help` becomes the text of its `t2r convert` flag; `checks`: its `choices`
    and bounds (`min`, `gt`, `max`, `lt`), checked by `validate`, by recipes and by the flag's parser."""
    return setting(default, help, **checks)


@dataclass
class MixerOptions:
    """What every converted layer decides: the feature map, RoPE and the output norm.

    A subclass per target sets its own defaults (redeclaring a field with a plain default keeps the help
    written here) and adds its own fields. When RoPE is kept it is applied after the feature map.
    """

    feature_map: str = option("identity", "map applied to q and k before the mixer", choices=FEATURE_MAPS)
    rope: bool = option(False, "apply the source's rotary embedding to q and k")
    output_norm: bool = option(False, "per-head RMS norm of the mixer output (no weight)")

    saved_before: ClassVar[dict] = {}
    """Values of fields added after models were saved: a saved config without such a field takes this value,
    so a model loads with the behaviour it was trained with (new conversions take the defaults)."""

    def validate(self) -> None:
        """Raise ValueError naming the bad field: its type, then its declared choices and bounds
        (`t2r.settings.check_value`); subclasses extend it."""
        for f in fields(self):
            expected, value = _FIELD_TYPES.get(str(f.type)), getattr(self, f.name)
            if expected and (not isinstance(value, expected) or (isinstance(value, bool) and expected is not bool)):
                raise ValueError(f"{f.name} must be a {f.type}, got {value!r}")
            check_value(f.name, value, field_meta(type(self), f.name))

    def starts_as_source(self) -> str | None:
        """Why a freshly converted layer with these options computes what the source attention did (said after
        `t2r convert`), or None: it computes something else until finetuned."""
        return None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


@dataclass
class RecurrentOptions(MixerOptions):
    """Options of every fixed-state mixer: an exact softmax over a window of recent tokens and a few sinks,
    beside the recurrent state (`t2r.layers.window`). window=0: the state alone."""

    window: int = option(0, "softmax over the last W tokens inside each converted layer; the state keeps only "
                            "what has left the window (0: off)", min=0, max=MAX_WINDOW)
    sinks: int = option(0, "with window: also attend to each sequence's first S tokens, never put in the state",
                        min=0, max=MAX_COUNT)

    def validate(self) -> None:
        super().validate()
        if self.sinks and not self.window:
            raise ValueError(f"sinks={self.sinks} needs a window (sinks are read by the window's softmax); "
                             "set window (e.g. 64) or sinks=0")


def gate_damping(default: float):
    """The `gate_logit_normalizer` option (GSA and GLA declare it, each with its own default)."""
    return option(default, "gate damping tau: log alpha = logsigmoid(W x) / tau (GSA eq. 8 uses 8, GLA 16)",
                  gt=0, max=1e4)


@dataclass
class GSAOptions(RecurrentOptions):
    """Gated slot attention, in the T2R setting of the GSA paper (sec. 4.2): the Swish feature map of eq. 9,
    softmax over slots, no output gate. RoPE dropped as in the paper's converted models (the decays carry
    position; KL to the source at conversion is 5.36 nats/token either way, `benchmarks/conversion_distance.py`).
    """

    feature_map: str = "swish"
    num_slots: int = option(64, "GSA: memory slots per kv head (M)", gt=0, max=MAX_COUNT)
    gate_logit_normalizer: float = gate_damping(8.0)


@dataclass
class LinearAttentionOptions(RecurrentOptions):
    """GLA and retention as the GSA paper converts them (sec. 4.2): ReLU feature maps, no Swish output gate,
    and no RoPE (farther from the source at conversion: SmolLM2 KL 5.25 vs 9.43 nats/token). Their read-out
    sum_s w_ts v_s, w_ts = phi(q_t).phi(k_s) decayed, is unnormalised; t2r divides it by sum_s w_ts (Katharopoulos
    et al. 2020, eq. 5), so that, like the softmax it replaces, the layer writes a weighted mean of values on
    the source's scale. The paper (after SUPRA) normalises with a per-head norm instead, which writes a unit-RMS
    vector at every token, 1-30x the source attention's output on SmolLM2: such students started farther from
    the source and stalled (issue 31). Models saved before `denominator` keep that norm (`output_norm=True`)."""

    feature_map: str = "relu"
    denominator: bool = option(True, "GLA, RetNet: divide the read-out by the sum of its weights phi(q).phi(k) "
                                     "(normalised linear attention, Katharopoulos et al. 2020 eq. 5)")

    saved_before: ClassVar[dict] = {"denominator": False}


@dataclass
class GLAOptions(LinearAttentionOptions):
    """Gated linear attention: a low-rank data-dependent forget gate."""

    gate_logit_normalizer: float = gate_damping(16.0)
    gate_low_rank_dim: int = option(16, "GLA: rank of the low-rank forget-gate projection", gt=0, max=MAX_COUNT)


@dataclass
class RetNetOptions(LinearAttentionOptions):
    """Retention: fixed per-head decays, no new parameter."""


@dataclass
class FoXOptions(MixerOptions):
    """Forgetting attention: softmax attention with a forget gate, so RoPE is kept and a converted layer
    starts as its source."""

    rope: bool = True
    fox_gate_bias: float = option(
        8.0, "FoX: initial forget-gate bias (logsigmoid(8) ~ -3.4e-4 per token: starts near the source)",
        min=-100, max=100)

    def starts_as_source(self) -> str | None:
        if not self.rope:
            return None
        return "its forget gates start open, so it writes like the source model until finetuning teaches them to forget"


@dataclass
class GatedDeltaOptions(RecurrentOptions):
    """Gated DeltaNet (Yang, Kautz & Hatamizadeh 2024): q and k L2-normalised per head (always) after the ReLU
    feature map, a per-head write strength beta and decay, a short convolution on q/k/v starting as the identity,
    no output norm and no output gate. Chosen by KL(source || converted) at conversion on SmolLM2
    (`benchmarks/results/conversion_distance_gdn_smollm2.md`): ReLU keeps q.k >= 0, so the read-out weighs the
    stored values as softmax does (identity: q.k of either sign, farther); the state is bounded by the delta rule's
    contraction, so the read-out needs no norm, and an output norm took it farther from the source's scale. The
    output gate and the convolution start as the identity, so conversion cannot tell them apart; the gate adds a
    rank-16 projection per layer and is off, the convolution (about 0.1% of the parameters) is on, as in the paper."""

    feature_map: str = "relu"
    conv_size: int = option(4, "gdn: kernel of the causal depthwise convolution on q, k, v, starting as the "
                               "identity (0: none)", min=0, max=64)
    output_gate: bool = option(False, "gdn: multiply the read-out by 2 sigmoid(low-rank W x), starting at 1")

    def validate(self) -> None:
        if isinstance(self.conv_size, bool) or not isinstance(self.conv_size, int) or self.conv_size == 1 or \
                self.conv_size < 0:  # before the generic checks, whose message would not name the 0 case
            raise ValueError(f"conv_size must be 0 (no convolution) or an integer >= 2, got {self.conv_size!r}")
        super().validate()
