"""Finetuning end to end on a tiny model (CPU): the loss goes down, an interrupted run resumed
from its last checkpoint ends with the same weights as an uninterrupted one, checkpoints are
atomic, and the trainable choices (gates, LoRA) and distillation run."""

import pytest
import torch

from t2r.train import Interrupt, finetune
from t2r.train import checkpoint as ckpt
from t2r.train.recipe import save_resolved
from tests.helpers.data import char_tokenizer, write_jsonl
from tests.helpers.models import tiny_source
from tests.helpers.recipes import final_weights, recipe


def test_loss_goes_down(tmp_path, source_dir, corpus):
    losses = []
    r = recipe(tmp_path, source_dir, corpus, **{"train.max_steps": 12})
    metrics = finetune(r, callbacks=[lambda m: losses.append(m["loss"])])
    assert len(losses) == 12 and metrics["step"] == 12
    assert sum(losses[-3:]) / 3 < losses[0] - 0.3, losses
    assert metrics["validation_loss"] < losses[0]
    assert (tmp_path / "run" / "final" / "recipe.yaml").is_file()
    assert [p.name for p in ckpt.checkpoints(r.checkpoint.dir)] == ["step-00000009", "step-00000012"]


def test_interrupted_and_resumed_equals_uninterrupted(tmp_path, source_dir, corpus):
    straight = recipe(tmp_path, source_dir, corpus, run="straight")
    finetune(straight)

    broken = recipe(tmp_path, source_dir, corpus, run="broken")

    def crash_after_step_4(metrics):
        if metrics["step"] == 4:
            raise Interrupt  # step 4 is lost: the last checkpoint is step 3

    with pytest.raises(Interrupt):
        finetune(broken, callbacks=[crash_after_step_4])
    assert ckpt.latest(broken.checkpoint.dir).name == "step-00000003"
    # the data stream's position after step 3: the resume begins there, reading nothing it trained on again
    position = ckpt.read_state(ckpt.latest(broken.checkpoint.dir))["data_position"]
    per_micro = broken.data.seq_len * broken.train.micro_batch_size
    assert position["index"] == 3 * broken.train.tokens_per_step // per_micro and position["doc"] is not None
    metrics = finetune(broken, resume=True)
    assert metrics["step"] == 6
    a, b = final_weights(straight), final_weights(broken)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=0, msg=name)


def test_resume_without_checkpoint_starts_fresh_and_half_written_checkpoints_are_ignored(tmp_path, source_dir,
                                                                                           corpus):
    """A run killed while writing its first checkpoint: its recipe.yaml and a half-written save."""
    r = recipe(tmp_path, source_dir, corpus, run="fresh", **{"train.max_steps": 3})
    stale = tmp_path / "fresh" / ".tmp-step-00000007"
    stale.mkdir(parents=True)
    save_resolved(r, tmp_path / "fresh")
    (stale / "model.safetensors").write_bytes(b"half")
    assert ckpt.latest(r.checkpoint.dir) is None
    assert finetune(r, resume=True)["step"] == 3
    assert not stale.exists()
    state = ckpt.read_state(ckpt.latest(r.checkpoint.dir))
    assert {k: state[k] for k in ("step", "tokens", "skipped_steps", "recipe_changes")} == {
        "step": 3, "tokens": 3 * 128, "skipped_steps": 0, "recipe_changes": []}
    assert set(state["loss_watch"]["train"]) == {"start", "best_next_token"}  # the collapse guard's record


def test_gates_only_leaves_the_rest_untouched(tmp_path, source_dir, corpus):
    r = recipe(tmp_path, source_dir, corpus, run="gates", **{"train.trainable": "gates", "train.max_steps": 2})
    finetune(r)
    import t2r

    start = t2r.convert(tiny_source("llama", vocab_size=len(char_tokenizer())), "gsa", num_slots=8).state_dict()
    trained = final_weights(r)
    changed = {n for n in trained if not torch.equal(trained[n], start[n])}
    assert changed and all("slot_gate" in n for n in changed), changed


def test_lora_and_distillation_run(tmp_path, source_dir, corpus):
    r = recipe(tmp_path, source_dir, corpus, run="lora", **{"train.trainable": "lora", "lora.r": 4,
                                                             "stages.distill.weight": 0.5, "train.max_steps": 2})
    metrics = finetune(r)
    assert metrics["step"] == 2 and metrics["loss_kl"] > 0 and metrics["loss_next_token"] > 0
    saved = {p.name for p in (tmp_path / "lora" / "final").iterdir()}
    assert "model.safetensors" in saved and "config.json" in saved  # merged: a complete model (test_lora_final.py)


def _align(student, teacher, batches, lr, trainable="attention", autocast=None):
    """The losses of an attention-MSE stage run step by step on `batches` (one optimizer step each), with the
    stage's own loss function and optimizer; `trainable`: attention (the converted attention modules) or gates."""
    import contextlib

    from t2r.optim import build_optimizer
    from t2r.train.losses import stage_loss
    from t2r.train.model_setup import new_modules
    from t2r.train.recipe import StageSection
    from t2r.train.transfer import AttentionTargets

    targets = AttentionTargets(student, teacher)
    modules = [s if trainable == "attention" else new_modules(s) for _, s, _ in targets.pairs]
    params = [p for m in modules for p in m.parameters()]
    optimizer = build_optimizer(params, lr, weight_decay=0.0)
    loss = stage_loss(student, teacher, targets, StageSection("align", loss={"attention_mse": 1.0}),
                      autocast or contextlib.nullcontext)
    losses = []
    for batch in batches:
        total, parts = loss(batch)
        total.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(parts["attention_mse"]))
    targets.close()
    return losses


def test_attention_transfer_trains_only_the_converted_attention():
    """An attention-MSE stage on a fixed batch: every converted layer pairs with its source layer, the
    distance falls, and nothing outside the converted attention modules moves."""
    import t2r
    from t2r.train.transfer import layer_pairs

    teacher = tiny_source("llama")
    student = t2r.convert(tiny_source("llama"), "gsa", layers="0,2")
    assert [i for i, _, _ in layer_pairs(student, teacher)] == [0, 2]
    before = {n: p.detach().clone() for n, p in student.named_parameters()}
    ids = torch.randint(3, 97, (1, 64), generator=torch.Generator().manual_seed(0))
    losses = _align(student, teacher, [{"input_ids": ids, "labels": ids}] * 10, lr=1e-3)
    assert len(losses) == 10 and losses[-1] < 0.5 * losses[0], losses
    moved = {n for n, p in student.named_parameters() if not torch.equal(p, before[n])}
    assert moved and all(n.startswith(("model.layers.0.self_attn.", "model.layers.2.self_attn.")) for n in moved)


def test_attention_transfer_on_gates_only_keeps_the_pretrained_projections():
    """trainable=gates: the new gates move, the reused q/k/v/o projections stay bit-identical."""
    import t2r

    teacher = tiny_source("llama")
    student = t2r.convert(tiny_source("llama"), "gsa")
    before = {n: p.detach().clone() for n, p in student.named_parameters()}
    ids = torch.randint(3, 97, (1, 64), generator=torch.Generator().manual_seed(0))
    losses = _align(student, teacher, [{"input_ids": ids}] * 5, lr=1e-2, trainable="gates")
    assert losses[-1] < losses[0], losses
    moved = {n for n, p in student.named_parameters() if not torch.equal(p, before[n])}
    assert moved and all(".self_attn." in n and not n.rsplit(".", 2)[-2].endswith("_proj") for n in moved), moved


def test_attention_transfer_under_autocast_sees_its_own_updates():
    """Mixed precision: each step computes with the weights the last step left (the stage loss enters autocast
    per step; one context around all steps kept the bf16 casts of the starting weights, and the MSE on a
    repeated batch stayed at its first value)."""
    import functools

    import t2r

    teacher = tiny_source("llama")
    student = t2r.convert(tiny_source("llama"), "gsa")
    ids = torch.randint(3, 97, (1, 64), generator=torch.Generator().manual_seed(0))
    bf16 = functools.partial(torch.autocast, "cpu", dtype=torch.bfloat16)
    losses = _align(student, teacher, [{"input_ids": ids}] * 4, lr=1e-3, autocast=bf16)
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    student = t2r.convert(tiny_source("llama"), "gsa")
    with bf16():  # the hazard itself: one context around every step, the casts of the first weights reused
        stale = _align(student, teacher, [{"input_ids": ids}] * 4, lr=1e-3)
    assert len(set(stale)) == 1, stale


def test_small_data_repeats_in_reshuffled_epochs_and_resumes_across_them(tmp_path, source_dir, corpus):
    """6 documents give a few micro-batches: the run goes on into later epochs, and an interrupted
    run resumed in a later epoch still matches the uninterrupted one."""
    small = {"data.max_documents": 6, "train.max_steps": 8, "checkpoint.every_steps": 4}
    straight = recipe(tmp_path, source_dir, corpus, run="ep-straight", **small)
    assert finetune(straight)["tokens"] == 8 * 128

    broken = recipe(tmp_path, source_dir, corpus, run="ep-broken", **small)

    def crash(metrics):
        if metrics["step"] == 6:
            raise Interrupt

    with pytest.raises(Interrupt):
        finetune(broken, callbacks=[crash])
    finetune(broken, resume=True)
    a, b = final_weights(straight), final_weights(broken)
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=0, msg=name)


def test_empty_training_data_is_a_clear_error(tmp_path, source_dir, corpus):
    r = recipe(tmp_path, source_dir, corpus, run="empty", **{"data.held_out": 60})
    with pytest.raises(ValueError, match="data.held_out: 60 documents held out, but .* holds only 60"):
        finetune(r)


def test_gradient_checkpointing_gives_the_same_training(tmp_path, source_dir, corpus):
    plain = recipe(tmp_path, source_dir, corpus, run="plain", **{"train.max_steps": 2, "data.held_out": 0})
    ckpt_ = recipe(tmp_path, source_dir, corpus, run="gc", **{"train.max_steps": 2, "data.held_out": 0,
                                                              "train.gradient_checkpointing": "true"})
    a, b = finetune(plain), finetune(ckpt_)
    assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
    for name, value in final_weights(plain).items():
        torch.testing.assert_close(final_weights(ckpt_)[name], value, rtol=1e-5, atol=1e-6)


def test_bf16_mixed_precision_trains(tmp_path, source_dir, corpus):
    losses = []
    r = recipe(tmp_path, source_dir, corpus, run="bf16", **{"train.mixed_precision": "bf16", "train.max_steps": 6,
                                                             "data.held_out": 0})
    finetune(r, callbacks=[lambda m: losses.append(m["loss"])])
    assert all(loss == loss for loss in losses) and losses[-1] < losses[0]
    assert final_weights(r)["model.embed_tokens.weight"].dtype == torch.float32  # fp32 master weights


def test_data_errors_stop_the_run_before_the_model_loads(tmp_path, source_dir, monkeypatch):
    import t2r.train.stages as stages
    from t2r.data.check import DataError

    monkeypatch.setattr(stages, "build_model", lambda recipe: pytest.fail("the model loaded before the data check"))
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl, line 2: not UTF-8 text"):
        finetune(recipe(tmp_path, source_dir, bad, run="bad"))
    short = tmp_path / "short.jsonl"  # 4 held-out documents of 5 tokens: less than a row of 32, the loss would be nan
    short.write_text('{"text": "tiny"}\n' * 12)
    with pytest.raises(DataError, match="data.held_out: the 4 held-out documents hold 20 tokens, less than one row"):
        finetune(recipe(tmp_path, source_dir, short, run="short", **{"data.held_out": 4}))
    assert not (tmp_path / "bad").exists() and not (tmp_path / "short").exists()


def test_reused_source_norms_are_not_new_gates():
    """Qwen3's q/k norms live in the converted layer but are the source's: `gates` never trains them."""
    import t2r
    from t2r.train.model_setup import new_module_names
    from tests.helpers.models import tiny_source as tiny_any

    assert new_module_names(t2r.convert(tiny_any("qwen3"), "gsa")) == ["slot_gate"]
    assert new_module_names(t2r.convert(tiny_any("qwen3"), "retnet")) == []


def test_attention_transfer_passes_positions_to_a_window_on_packed_documents():
    """A fresh windowed conversion is exactly its source on documents no longer than window + sinks, packed ones
    included: stage 1 starts at MSE 0 only if each document's positions reach the layer (its sinks and window
    restart there)."""
    import t2r
    from t2r.data.packing import collate_packed
    teacher = tiny_source("llama")
    student = t2r.convert(tiny_source("llama"), "gsa", num_slots=8, window=8, sinks=2)
    generator = torch.Generator().manual_seed(0)
    rows = [{"input_ids": torch.randint(3, 97, (n,), generator=generator).tolist(), "position_ids": list(range(n))}
            for n in (7, 10, 5)]
    batch = collate_packed(rows)
    first = _align(student, teacher, [batch], lr=1e-3)[0]
    assert first < 1e-10, first


def test_every_micro_batch_is_whole_the_epochs_last_rows_are_left_out(tmp_path, source_dir):
    """8 documents pack into 7 micro-batches of 4 x 32 tokens and one of 32 tokens: that one is left out (a
    compiled step would compile again for its shape), so every step trains on train.tokens_per_step tokens."""
    import json

    data = write_jsonl(tmp_path / "eight.jsonl", [{"text": "the quick brown fox jumps over the lazy dog " * 3}] * 8)
    r = recipe(tmp_path, source_dir, data, **{"data.held_out": 1, "train.micro_batch_size": 4,
                                               "train.tokens_per_step": 256, "train.max_steps": 5})
    finetune(r)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if "tokens_per_s" in row]
    assert [row["tokens"] for row in steps] == [256 * k for k in range(1, 6)]
