"""The dry-run plan: parameter counts from the config alone match the model a recipe builds; memory splits."""

import pytest

from t2r.sources import load_config
from t2r.train.model_setup import build_model, trainable_parameters
from t2r.train.plan import count_parameters, format_plan, memory_rows
from tests.helpers.recipes import recipe


@pytest.mark.parametrize("overrides", [
    {}, {"train.trainable": "attention"}, {"train.trainable": "gates"},
    {"train.trainable": "lora", "lora.r": 4}, {"convert.layers": "0,2"}, {"convert.target": "none",
                                                                          "convert.options": "{}"},
])
def test_counts_from_the_config_match_the_built_model(tmp_path, source_dir, corpus, overrides):
    tiny = recipe(tmp_path, source_dir, corpus, **overrides)
    counts = count_parameters(tiny, load_config(str(source_dir)))
    model, _, _ = build_model(tiny)
    trainable, total = trainable_parameters(model)
    if tiny.train.trainable == "lora":  # peft's count includes the gates' saved copies: compare the adapters
        assert counts.trainable == trainable
    else:
        assert (counts.total, counts.trainable) == (total, trainable)


def test_memory_splits_and_time(tmp_path, source_dir, corpus):
    tiny = recipe(tmp_path, source_dir, corpus, **{"stages.distill": "{weight: 1.0}"})
    counts = count_parameters(tiny, load_config(str(source_dir)))
    rows = {(r["strategy"], r["gpus"]): r for r in memory_rows(tiny, counts)}
    assert rows[("DDP", 8)]["weights"] == rows[("DDP", 1)]["weights"] > 0
    assert rows[("FSDP", 2)]["optimizer"] == pytest.approx(rows[("FSDP", 1)]["optimizer"] / 2)
    assert rows[("FSDP", 1)]["teacher"] > 0 and rows[("FSDP", 4)]["activations"] == rows[("DDP", 1)]["activations"]
    # every process holds a whole teacher: FSDP shards only the prepared student
    assert rows[("FSDP", 8)]["teacher"] == rows[("FSDP", 1)]["teacher"] == rows[("DDP", 8)]["teacher"]
    text = format_plan(tiny, counts, tokens_per_second=100.0)
    assert "| FSDP | 8 |" in text and "8 GPUs:" in text
    assert "pass --tokens-per-second" in format_plan(tiny, counts)


@pytest.mark.parametrize("overrides", [{}, {"stages.distill": "{weight: 0.5}"}])
def test_measure_trains_a_few_steps_and_writes_nothing(tmp_path, source_dir, corpus, overrides):
    from t2r.train.measure import format_measured, measure_throughput

    tiny = recipe(tmp_path, source_dir, corpus, **overrides)
    measured = measure_throughput(tiny, steps=2)
    assert measured.tokens_per_second > 0 and measured.step_seconds > 0 and measured.peak_bytes >= 0
    assert measured.tokens_per_second == pytest.approx(
        tiny.train.micro_batch_size * tiny.data.seq_len / measured.step_seconds)
    assert not (tmp_path / "run").exists()  # no run directory, no checkpoint
    assert "tokens/s" in format_measured(measured, 1.0)
    with pytest.raises(ValueError, match="at least 1"):
        measure_throughput(tiny, steps=0)


def test_the_loss_memory_follows_the_loss():
    """Whole logits for the next-token loss and the plain KL; one chunk of tokens' for the fused KL (the default);
    none for attention MSE alone."""
    from types import SimpleNamespace

    from t2r.train.kl import DEFAULT_CHUNK_TOKENS
    from t2r.train.plan import loss_bytes

    def stage(**loss):
        return SimpleNamespace(micro_batch_size=8, seq_len=2048, loss=loss)

    vocab, tokens = 49152, 8 * 2048
    assert loss_bytes(stage(kl=0.9, next_token=0.1), vocab, fused_kl=False) == 24 * tokens * vocab
    assert loss_bytes(stage(kl=0.9, next_token=0.1), vocab, fused_kl=True) == 24 * DEFAULT_CHUNK_TOKENS * vocab
    assert loss_bytes(stage(next_token=1.0), vocab, fused_kl=True) == 14 * tokens * vocab
    assert loss_bytes(stage(attention_mse=1.0), vocab, fused_kl=True) == 0
