"""Options of the recurrent mixers, validated once, saved in the model config as a plain dict."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

MIXERS = ("gsa", "gla", "retnet", "fox")
"""Recurrent targets a softmax attention layer can be converted to."""

FEATURE_MAPS = ("identity", "relu", "swish", "elu1")


@dataclass
class MixerOptions:
    """How a converted layer computes its mixer; `None` fields take the per-target default below.

    Defaults follow the T2R setting of the GSA paper (sec. 4.2): ReLU feature maps for GLA and RetNet,
    no Swish output gate; GSA keeps its softmax over slots and the Swish feature map of eq. 9.
    RoPE: dropped for GSA, GLA and RetNet, as in the paper's converted models (their decays carry
    position), and because it measured farther from the source at conversion for GLA and RetNet
    (SmolLM2, `benchmarks/conversion_distance.py`: KL 6.45 nats/token without RoPE vs 8.72 with;
    GSA 5.36 either way).
    Kept for FoX, which is softmax attention with a forget gate: with RoPE it starts as the source model.
    When kept, RoPE is applied after the feature map.
    """

    feature_map: str | None = None
    """Map applied to q and k before the mixer: identity | relu | swish | elu1."""
    rope: bool | None = None
    """Apply the source model's rotary embedding to q and k (default: FoX only, see above)."""
    output_norm: bool | None = None
    """Per-head RMS normalisation of the mixer output (no learnable weight): needed by unnormalised
    linear attention (GLA, RetNet; SUPRA's finding), not by GSA or FoX whose outputs are averages of v."""
    num_slots: int = 64
    """GSA: memory slots per kv head (M)."""
    gate_logit_normalizer: float | None = None
    """Damping tau of the gates: log alpha = logsigmoid(W x) / tau (GSA eq. 8 uses tau = 8; GLA 16)."""
    gate_low_rank_dim: int = 16
    """GLA: rank of the low-rank forget-gate projection."""
    fox_gate_bias: float = 8.0
    """FoX: initial bias of the forget gate; logsigmoid(8) ~ -3.4e-4 per token keeps the converted
    model within a small bias of the source over a few thousand tokens."""

    @staticmethod
    def defaults(target: str) -> dict:
        return {
            "gsa": dict(feature_map="swish", rope=False, output_norm=False, gate_logit_normalizer=8.0),
            "gla": dict(feature_map="relu", rope=False, output_norm=True, gate_logit_normalizer=16.0),
            "retnet": dict(feature_map="relu", rope=False, output_norm=True),
            "fox": dict(feature_map="identity", rope=True, output_norm=False),
        }[target]

    @classmethod
    def resolve(cls, target: str, **overrides) -> "MixerOptions":
        """Options for `target` with user overrides; raises ValueError naming any bad field."""
        if target not in MIXERS:
            raise ValueError(f"unknown target {target!r}: choose one of {', '.join(MIXERS)}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"unknown conversion option(s) {unknown}; valid options: {sorted(known)}")
        values = cls.defaults(target)
        values.update({k: v for k, v in overrides.items() if v is not None})
        options = cls(**values)
        options.validate(target)
        return options

    def validate(self, target: str) -> None:
        if self.feature_map not in FEATURE_MAPS:
            raise ValueError(f"feature_map={self.feature_map!r} is not one of {FEATURE_MAPS}")
        if target == "gsa" and (not isinstance(self.num_slots, int) or self.num_slots <= 0):
            raise ValueError(f"num_slots must be a positive integer, got {self.num_slots!r} (GSA paper uses 64)")
        if self.gate_logit_normalizer is not None and self.gate_logit_normalizer <= 0:
            raise ValueError(f"gate_logit_normalizer must be > 0, got {self.gate_logit_normalizer}")
        if target == "gla" and self.gate_low_rank_dim <= 0:
            raise ValueError(f"gate_low_rank_dim must be > 0, got {self.gate_low_rank_dim}")

    def to_dict(self) -> dict:
        return asdict(self)
