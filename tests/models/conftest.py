"""Tiny random source models of every supported architecture (built from configs, no download)."""

import pytest
import torch
from transformers import (
    Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, Phi3Config, Phi3ForCausalLM, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
    Qwen3ForCausalLM,
)

from t2r.layers import MIXERS

COMMON = dict(
    vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    pad_token_id=0, bos_token_id=1, eos_token_id=2,
)


def tiny_source(arch: str, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    if arch == "llama":
        config = LlamaConfig(**{**COMMON, **overrides})
        model = LlamaForCausalLM(config)
    elif arch == "mistral":
        config = MistralConfig(**{**COMMON, "sliding_window": 16, **overrides})
        model = MistralForCausalLM(config)
    elif arch == "qwen2":
        config = Qwen2Config(**{**COMMON, **overrides})
        model = Qwen2ForCausalLM(config)
    elif arch == "qwen3":
        fields = {**COMMON, **overrides}  # Qwen3Config's head_dim defaults to 128, not hidden / heads
        config = Qwen3Config(**{"head_dim": fields["hidden_size"] // fields["num_attention_heads"], **fields})
        model = Qwen3ForCausalLM(config)
        with torch.no_grad():  # q/k norm weights that are not all ones, so a dropped norm shows up
            for layer in model.model.layers:
                layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
                layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
    elif arch == "phi3":  # fused qkv_proj, RoPE on half of each head
        config = Phi3Config(**{**COMMON, "partial_rotary_factor": 0.5, **overrides})
        model = Phi3ForCausalLM(config)
    elif arch == "gemma3_text":
        fields = {**COMMON, **overrides}
        n = fields["num_hidden_layers"]
        config = Gemma3TextConfig(**{
            "head_dim": fields["hidden_size"] // fields["num_attention_heads"],
            "query_pre_attn_scalar": 12,  # not head_dim: a mixer that ignores the source's scale shows up
            "sliding_window": 16, "layer_types": ["full_attention" if i % 2 else "sliding_attention" for i in range(n)],
            **fields})
        model = Gemma3ForCausalLM(config)
        with torch.no_grad():  # norms start at zero (Gemma scales by 1 + w): make them matter
            for name, param in model.named_parameters():
                if "norm" in name:
                    param.uniform_(-0.5, 0.5)
    else:
        raise ValueError(arch)
    with torch.no_grad():  # a pad embedding that is not zero, so missing padding masks show up
        model.get_input_embeddings().weight[COMMON["pad_token_id"]].normal_()
    return model.eval()


ARCHS = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3_text")
TARGETS = tuple(MIXERS)  # every registered target


@pytest.fixture(params=ARCHS)
def arch(request):
    return request.param


@pytest.fixture(params=TARGETS)
def target(request):
    return request.param


def small(target: str) -> dict:
    """Options that keep a tiny model tiny: 8 GSA slots (other targets have no slots)."""
    return {"num_slots": 8} if "num_slots" in MIXERS[target].options.field_names() else {}
