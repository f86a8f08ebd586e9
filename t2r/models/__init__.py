"""Converted model classes, their configs and cache, registered with the transformers Auto classes."""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from t2r.models.architectures import ARCHITECTURES, SourceAdapter
from t2r.models.generation_cache import T2RCache
from t2r.models.configuration import (
    T2RGemma3TextConfig, T2RLlamaConfig, T2RMistralConfig, T2RPhi3Config, T2RQwen2Config, T2RQwen3Config,
)
from t2r.models.modeling import (
    T2RGemma3ForCausalLM, T2RGemma3TextModel, T2RLlamaForCausalLM, T2RLlamaModel, T2RMistralForCausalLM,
    T2RMistralModel, T2RPhi3ForCausalLM, T2RPhi3Model, T2RQwen2ForCausalLM, T2RQwen2Model, T2RQwen3ForCausalLM,
    T2RQwen3Model,
)

for _config, _model, _causal_lm in (adapter.classes for adapter in ARCHITECTURES.values()):
    AutoConfig.register(_config.model_type, _config, exist_ok=True)
    AutoModel.register(_config, _model, exist_ok=True)
    AutoModelForCausalLM.register(_config, _causal_lm, exist_ok=True)

__all__ = [
    "ARCHITECTURES", "SourceAdapter", "T2RCache",
    "T2RLlamaConfig", "T2RMistralConfig", "T2RQwen2Config", "T2RQwen3Config",
    "T2RLlamaModel", "T2RLlamaForCausalLM", "T2RMistralModel", "T2RMistralForCausalLM",
    "T2RQwen2Model", "T2RQwen2ForCausalLM", "T2RQwen3Model", "T2RQwen3ForCausalLM",
    "T2RPhi3Config", "T2RPhi3Model", "T2RPhi3ForCausalLM",
    "T2RGemma3TextConfig", "T2RGemma3TextModel", "T2RGemma3ForCausalLM",
]
