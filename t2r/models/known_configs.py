"""Configs of the hub models the shipped recipes name, built in: `--dry-run` plans their memory from the shape
alone, so it needs no hub access (offline, it would otherwise retry for ~20 s and skip the plan).

Each entry holds the fields of the model's published config.json that decide its shape."""

from __future__ import annotations

KNOWN_CONFIGS = {
    "mistralai/Mistral-7B-v0.1": ("mistral", dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=32768, sliding_window=4096, rms_norm_eps=1e-5,
        rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)),
    "meta-llama/Meta-Llama-3-8B": ("llama", dict(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0,
        tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001)),
}


def known_config(spec: str):
    """The built-in config of hub id `spec` (a transformers `PretrainedConfig`), or None when it is not one of
    `KNOWN_CONFIGS`."""
    if spec not in KNOWN_CONFIGS:
        return None
    from transformers import AutoConfig

    model_type, fields = KNOWN_CONFIGS[spec]
    return AutoConfig.for_model(model_type, **fields)
