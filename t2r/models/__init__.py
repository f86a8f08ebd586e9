"""Converted model classes, their configs and cache, registered with the transformers Auto classes."""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from t2r.models.cache import T2RCache
from t2r.models.configuration import T2RLlamaConfig, T2RMistralConfig, T2RQwen2Config
from t2r.models.modeling import (
    T2RLlamaForCausalLM, T2RLlamaModel, T2RMistralForCausalLM, T2RMistralModel, T2RQwen2ForCausalLM, T2RQwen2Model,
)

ARCHITECTURES = {
    # source model_type: (config class, base model class, causal LM class)
    "llama": (T2RLlamaConfig, T2RLlamaModel, T2RLlamaForCausalLM),
    "mistral": (T2RMistralConfig, T2RMistralModel, T2RMistralForCausalLM),
    "qwen2": (T2RQwen2Config, T2RQwen2Model, T2RQwen2ForCausalLM),
}
"""Source architectures that can be converted, keyed by the source config's `model_type`."""

for _config, _model, _causal_lm in ARCHITECTURES.values():
    AutoConfig.register(_config.model_type, _config, exist_ok=True)
    AutoModel.register(_config, _model, exist_ok=True)
    AutoModelForCausalLM.register(_config, _causal_lm, exist_ok=True)

__all__ = [
    "ARCHITECTURES", "T2RCache", "T2RLlamaConfig", "T2RMistralConfig", "T2RQwen2Config",
    "T2RLlamaModel", "T2RLlamaForCausalLM", "T2RMistralModel", "T2RMistralForCausalLM",
    "T2RQwen2Model", "T2RQwen2ForCausalLM",
]
