"""Staged recipes (`stages:` as a list) on the tiny model: stages run in order with their own lr, sequence length,
trainable set and loss mix, log their own rows, resume exactly inside a stage, and are validated before anything
loads; the fixed `stages.attention_transfer` / `stages.distill` sections still load as before."""

import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from t2r.train import CheckpointError, Interrupt, finetune, load_recipe
from t2r.train import checkpoint as ckpt
from t2r.train.recipe import RecipeError
from t2r.train.stages import describe
from tests.helpers.recipes import final_weights, free_port, recipe, torchrun_failure

ALIGN = {"name": "align", "loss": "attention_mse", "steps": 2, "lr": 1.0e-3, "warmup_steps": 0,
         "schedule": "constant", "trainable": "gates"}
DISTILL = {"name": "distill", "loss": {"kl": 0.75, "next_token": 0.25}, "steps": 4, "lr": 2.0e-3, "warmup_steps": 1,
           "temperature": 2.0}
FINETUNE = {"name": "finetune", "loss": "next_token", "tokens": 256, "lr": 5.0e-4, "warmup_steps": 0,
            "schedule": "constant", "seq_len": 64}


def staged(tmp_path, source_dir, corpus, run="staged", stages=(ALIGN, DISTILL, FINETUNE), **overrides):
    """The conftest recipe with a stage list (train.max_steps unset: every stage has its own budget)."""
    flow = yaml.safe_dump([dict(s) for s in stages], default_flow_style=True, width=10_000).strip()
    return recipe(tmp_path, source_dir, corpus, run=run, **{"train.max_steps": "null", "stages": flow,
                                                            "checkpoint.every_steps": 2, **overrides})


def rows(r):
    return [json.loads(line) for line in (Path(r.checkpoint.dir) / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def straight(tmp_path_factory, source_dir, corpus):
    """One uninterrupted three-stage run (2 + 4 + 2 steps) and its metrics rows."""
    r = staged(tmp_path_factory.mktemp("straight"), source_dir, corpus)
    final = finetune(r)
    return r, final, rows(r)


def test_stages_run_in_order_with_their_own_lr_rows_and_checkpoints(straight):
    r, final, metrics = straight
    steps = [m for m in metrics if "loss" in m]
    assert [(m["stage"], m["stage_step"], m["step"]) for m in steps] == [
        ("align", 1, 1), ("align", 2, 2), *[("distill", k, 2 + k) for k in range(1, 5)],
        ("finetune", 1, 7), ("finetune", 2, 8)]
    assert final["step"] == 8 and final["tokens"] == 8 * 128 and final["stage"] == "finetune"
    lrs = {m["stage"]: [] for m in steps}
    for m in steps:
        lrs[m["stage"]].append(m["lr"])
    assert lrs["align"] == [1e-3, 1e-3] and lrs["finetune"] == [5e-4, 5e-4]
    # distill: warmup 1, then cosine over its own 4 steps down to 0.1 x 2e-3 (a fresh schedule per stage)
    assert lrs["distill"] == pytest.approx(
        [2e-3] + [2e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * k / 3))) for k in range(3)])
    assert [set(k for k in m if k.startswith("loss_")) for m in steps[:3]] == [
        {"loss_attention_mse"}, {"loss_attention_mse"}, {"loss_kl", "loss_next_token"}]
    assert "held_out_loss" in metrics[-1]
    names = [p.name for p in ckpt.checkpoints(r.checkpoint.dir)]
    assert names == ["step-00000006-distill", "step-00000008-finetune"]  # keep_last 2
    state = ckpt.read_state(ckpt.latest(r.checkpoint.dir))
    assert (state["stage"], state["stage_step"], state["step"]) == ("finetune", 2, 8)


def test_mixed_loss_is_the_weighted_sum_of_its_parts(straight):
    for m in straight[2]:
        if m.get("stage") == "distill":
            assert m["loss"] == pytest.approx(0.75 * m["loss_kl"] + 0.25 * m["loss_next_token"], rel=1e-5)
        elif m.get("stage") == "align":
            assert m["loss"] == pytest.approx(m["loss_attention_mse"], rel=1e-6)


def test_a_longer_sequence_in_a_later_stage_takes_effect(tmp_path, source_dir, corpus, monkeypatch):
    import t2r.train.stages as stages

    seen = []
    r = staged(tmp_path, source_dir, corpus, **{"data.held_out": 0},
               stages=[dict(DISTILL, steps=1, warmup_steps=0), dict(FINETUNE, tokens=128)])
    original = stages.stage_loss

    def spy(model, teacher, targets, stage, autocast, fused=False):
        loss = original(model, teacher, targets, stage, autocast, fused)

        def wrapped(batch):
            seen.append((stage.name, tuple(batch["input_ids"].shape)))
            return loss(batch)
        return wrapped

    monkeypatch.setattr(stages, "stage_loss", spy)
    finetune(r)
    # 128 tokens a step: 2 micro-batches of 2 rows x 32 (flattened into one packed row), then 1 of 2 x 64
    assert seen == [("distill", (1, 64))] * 2 + [("finetune", (1, 128))]
    assert [m["stage"] for m in rows(r) if "loss" in m] == ["distill", "finetune"]


def test_a_stage_trains_only_its_trainable_set(tmp_path, source_dir, corpus):
    """align trains the gates only: after it (checkpoint of its last step) nothing else has moved."""
    from safetensors.torch import load_file

    import t2r
    from tests.helpers.data import char_tokenizer
    from tests.helpers.models import tiny_source

    r = staged(tmp_path, source_dir, corpus, stages=[ALIGN, dict(FINETUNE, tokens=128)],
               **{"checkpoint.keep_last": 5, "data.held_out": 0})
    finetune(r)
    start = t2r.convert(tiny_source("llama", vocab_size=len(char_tokenizer())), "gsa", num_slots=8).state_dict()
    aligned = load_file(f"{r.checkpoint.dir}/step-00000002-align/model.safetensors")
    moved = {n for n in aligned if not torch.equal(aligned[n], start[n])}
    assert moved and all("slot_gate" in n for n in moved), moved
    trained = final_weights(r)  # the finetune stage trains everything
    assert not torch.equal(trained["model.embed_tokens.weight"], start["model.embed_tokens.weight"])


def test_killed_inside_the_second_stage_resumes_to_the_uninterrupted_weights(tmp_path, source_dir, corpus, straight,
                                                                             capsys):
    broken = staged(tmp_path, source_dir, corpus, run="broken")

    def kill(metrics):
        if metrics["step"] == 5:  # distill step 3; the newest checkpoint is step 4 (distill step 2)
            raise Interrupt

    with pytest.raises(Interrupt):
        finetune(broken, callbacks=[kill])
    assert ckpt.latest(broken.checkpoint.dir).name == "step-00000004-distill"
    position = ckpt.read_state(ckpt.latest(broken.checkpoint.dir))["data_position"]  # the resume starts there
    assert position is not None and position["index"] == 4 * 128 // (32 * 2) and position["doc"] is not None
    final = finetune(broken, resume=True)
    assert "resumed from" in capsys.readouterr().out
    assert final["step"] == 8
    a, b = final_weights(straight[0]), final_weights(broken)
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=0, msg=name)
    again = rows(broken)
    assert [(m["stage"], m["stage_step"]) for m in again if "loss" in m] == [
        (m["stage"], m["stage_step"]) for m in straight[2] if "loss" in m]  # the lost step 5 is not counted twice
    for old, new in zip((m for m in straight[2] if "loss" in m), (m for m in again if "loss" in m)):
        assert new["loss"] == pytest.approx(old["loss"], rel=1e-6) and new["lr"] == old["lr"]


def test_resume_refuses_a_changed_stage_list(tmp_path, source_dir, corpus, straight):
    import shutil

    shutil.copytree(straight[0].checkpoint.dir, tmp_path / "run")
    shutil.rmtree(tmp_path / "run" / "final")
    changed = staged(tmp_path, source_dir, corpus, run="run", stages=[ALIGN, dict(DISTILL, lr=1e-3), FINETUNE])
    with pytest.raises(CheckpointError, match=r"the stage list differs .*\n  stages.distill.lr: 0.002 -> 0.001\n"):
        finetune(changed, resume=True)
    reordered = staged(tmp_path, source_dir, corpus, run="run", stages=[ALIGN, FINETUNE, DISTILL])
    with pytest.raises(CheckpointError, match="stage order: align, distill, finetune -> align, finetune, distill"):
        finetune(reordered, resume=True)
    legacy = recipe(tmp_path, source_dir, corpus, run="run", **{"train.max_steps": 8})
    with pytest.raises(CheckpointError, match=r"stages.\(no stage list: one stage from train:\)"):
        finetune(legacy, resume=True)


def test_the_mapping_form_reads_into_a_stage_list(tmp_path, source_dir, corpus):
    """`stages.distill` alone is one stage with the same loss; `stages.attention_transfer` has no stage of the same
    meaning and is refused with the nearest list printed, which loads and runs as it stands."""
    r = recipe(tmp_path, source_dir, corpus, run="legacy", **{"stages.distill.weight": 0.75,
                                                               "stages.distill.temperature": 2, "train.max_steps": 2})
    assert [(s.name, s.loss, s.temperature, s.steps, s.lr) for s in r.stages] == [
        ("distill", {"kl": 0.75, "next_token": 0.25}, 2.0, 2, r.train.lr)]
    final = finetune(r)
    assert final["step"] == 2 and final["loss_kl"] > 0 and final["loss_next_token"] > 0
    with pytest.raises(RecipeError, match="stages.attention_transfer: the mapping form") as refused:
        recipe(tmp_path, source_dir, corpus, run="legacy2", **{"stages.attention_transfer.steps": 4,
                                                                "stages.attention_transfer.params": "gates",
                                                                "stages.distill.weight": 1.0, "train.max_steps": 2})
    listed = yaml.safe_load(str(refused.value).split("\n", 1)[1])["stages"]
    # 4 micro-batches of 2 x 32 tokens = 2 steps of train.tokens_per_step (128)
    assert listed == [{"name": "align", "loss": "attention_mse", "steps": 2, "lr": 1e-3, "schedule": "constant",
                       "warmup_steps": 0, "trainable": "gates"},
                      {"name": "distill", "loss": {"kl": 1.0}, "temperature": 1.0}]
    migrated = staged(tmp_path, source_dir, corpus, run="migrated", stages=listed, **{"train.max_steps": 2})
    assert finetune(migrated)["step"] == 4


def test_resolved_stages_inherit_train_values_and_round_trip(tmp_path, source_dir, corpus):
    from t2r.train.recipe import save_resolved

    r = staged(tmp_path, source_dir, corpus, stages=[{"name": "a", "loss": "kl", "tokens": 512},
                                                     {"name": "b", "warmup_steps": 0}], **{"train.max_steps": 3})
    a, b = r.stages
    assert (a.loss, a.tokens, a.steps, a.lr, a.warmup_steps, a.trainable, a.seq_len) == (
        {"kl": 1.0}, 512, None, 3e-3, 2, "all", 32)
    assert (b.loss, b.steps, b.micro_batch_size, r.total_steps) == ({"next_token": 1.0}, 3, 2, 4 + 3)
    assert load_recipe(save_resolved(r, tmp_path / "saved")) == r
    lowered = staged(tmp_path, source_dir, corpus, stages=[{"name": "a", "loss": "kl", "tokens": 512},
                                                           {"name": "b", "warmup_steps": 0}],
                     **{"train.max_steps": 3, "stages.b.lr": 1e-4, "stages.0.steps": 4, "stages.a.tokens": "null"})
    assert (lowered.stages[1].lr, lowered.stages[0].steps, lowered.stages[0].tokens) == (1e-4, 4, None)
    text = describe(r)
    assert "1. a: 4 steps (512 tokens), lr 0.003" in text and "loss 1 kl (T=1)" in text and "2. b: 3 steps" in text


@pytest.mark.parametrize("stages, overrides, message", [
    ([{"name": "a", "loss": "mse", "steps": 4}], {}, "stages[0] (a).loss: unknown loss 'mse'; expected next_token"),
    ([{"name": "a", "loss": {"kl": 0.9, "nt": 0.1}, "steps": 4}], {}, "unknown loss 'nt'"),
    ([{"name": "a", "loss": {"kl": 0}, "steps": 4}], {}, "stages[0] (a).loss: every weight is 0"),
    ([{"name": "a", "loss": {"kl": -1}, "steps": 4}], {}, "stages[0] (a).loss.kl: the weight must be a number >= 0"),
    ([{"name": "a", "steps": 2, "tokens": 256}], {}, "stages[0] (a).steps / tokens: set exactly one of them (got both"),
    ([{"name": "a"}], {}, "stages[0] (a).steps / tokens: missing; set the stage's steps or tokens (or train.max_steps"),
    ([{"name": "a", "steps": 4}, {"name": "a", "steps": 4}], {}, "stages[1].name: 'a' names two stages"),
    ([{"name": "a b", "steps": 4}], {}, "stages[0].name: 'a b' is not usable in a checkpoint name"),
    ([{"name": "a", "steps": 4, "lr": 0}], {}, "stages[0].lr: must be > 0, got 0.0"),
    ([{"name": "a", "steps": 4, "loos": "kl"}], {}, "stages[0].loos: unknown field; did you mean 'loss'?"),
    ([{"name": "a", "steps": 4, "schedule": "step"}], {}, "stages[0].schedule: 'step' is not one of cosine"),
    ([{"name": "a", "tokens": 100}], {}, "stages[0] (a).tokens: 100 is less than one step (train.tokens_per_step=128)"),
    ([{"name": "a", "steps": 2, "warmup_steps": 5}], {}, "stages[0] (a).warmup_steps: 5 warmup steps in a stage of 2"),
    ([{"name": "a", "steps": 4, "seq_len": 48}], {}, "stages[0] (a).seq_len: 48 x micro_batch_size 2 = 96 tokens"),
    ([{"name": "a", "loss": "kl", "steps": 4}], {"convert.target": "none", "convert.options": "{}"},
     "stages[0] (a).loss: kl compares against the unconverted source, but convert.target is 'none'"),
    ([{"name": "a", "loss": "attention_mse", "steps": 4}], {"convert.target": "none", "convert.options": "{}"},
     "attention_mse compares against the unconverted source"),
    ([{"name": "a", "steps": 4, "trainable": "gates"}], {"convert.target": "retnet", "convert.options": "{}"},
     "stages[0] (a).trainable: 'gates' trains the new gates, and target 'retnet' adds none"),
    ([{"name": "a", "steps": 4, "trainable": "lora"}], {}, "stages[0] (a).trainable: 'lora' with train.trainable="),
    ([], {}, "stages: an empty list"),
    ([{"name": "a", "steps": 4}], {"train.max_steps": 3, "train.max_tokens": 1280},
     "train.max_steps / train.max_tokens: set exactly one of them (got both)"),
])
def test_stage_errors_name_the_field_and_the_fix(tmp_path, source_dir, corpus, stages, overrides, message):
    with pytest.raises(RecipeError) as info:
        staged(tmp_path, source_dir, corpus, stages=stages, **overrides)
    assert message in str(info.value)


def test_stage_overrides_name_a_stage(tmp_path, source_dir, corpus):
    with pytest.raises(RecipeError, match=r"stages.alin: no stage named 'alin'; did you mean 'align'\?"):
        staged(tmp_path, source_dir, corpus, **{"stages.alin.lr": 1e-3})
    with pytest.raises(RecipeError, match="stages.align: is a stage, not a field"):
        staged(tmp_path, source_dir, corpus, **{"stages.align": 1})


def test_two_processes_run_the_stages_like_one(tmp_path, source_dir, corpus):
    """DDP over gloo: every stage's trainable set stays in the wrapped model (only the optimizer narrows it), and
    attention MSE, which never calls the wrapped forward, averages its gradients by hand: the same weights."""
    import os
    import subprocess
    import sys

    from safetensors.torch import load_file

    stages = [ALIGN, dict(DISTILL, steps=2), dict(FINETUNE, tokens=256)]
    overrides = {"train.tokens_per_step": 256, "data.held_out": 0}
    single = staged(tmp_path, source_dir, corpus, run="single", stages=stages, **overrides)
    finetune(single)
    staged(tmp_path, source_dir, corpus, run="ddp", stages=stages, **overrides)  # writes ddp.yaml
    flow = yaml.safe_dump([dict(s) for s in stages], default_flow_style=True, width=10_000).strip()
    args = {"train.max_steps": "null", "stages": flow, "checkpoint.every_steps": 2, **overrides}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           "-m", "t2r.cli", "finetune", "--config", str(tmp_path / "ddp.yaml"), *[f"{k}={v}" for k, v in args.items()]]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        pytest.fail(torchrun_failure(done.stderr))
    assert "stage 1/3 align" in done.stdout and "x 2 processes per step" in done.stdout
    a = load_file(tmp_path / "single" / "final" / "model.safetensors")
    b = load_file(tmp_path / "ddp" / "final" / "model.safetensors")
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=1e-5, msg=name)


def test_the_shipped_staged_recipes():
    root = Path(__file__).resolve().parents[2] / "recipes"
    cpu = load_recipe(root / "smollm2-staged-cpu.yaml", check_files=False)
    assert [s.name for s in cpu.stages] == ["align", "distill", "finetune"] and cpu.total_steps == 22
    assert [s.loss for s in cpu.stages] == [{"attention_mse": 1.0}, {"kl": 0.9, "next_token": 0.1}, {"next_token": 1.0}]
    h100 = load_recipe(root / "smollm2-staged-h100.yaml", check_files=False)
    assert [s.num_steps(65536) for s in h100.stages] == [30, 915, 305] and h100.stages[2].seq_len == 4096
    assert h100.needs_teacher and (h100.train.mixed_precision, h100.train.max_steps) == ("bf16", None)


def test_stepped_parameters_follow_the_optimizer_to_replaced_parameters():
    """After FSDP2's prepare every parameter is a new (sharded) object and the optimizer points at the new ones:
    the step clips and counts those, in the model's order (accelerate's clip_grad_norm_ compares the list with
    `model.parameters()` element by element), whatever the order of the optimizer's groups."""
    from t2r.train.stages import stepped_parameters

    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 2), torch.nn.Linear(2, 2))
    old = list(model.parameters())
    optimizer = torch.optim.AdamW([{"params": old[4:]}, {"params": old[2:4], "weight_decay": 0.0}])  # not layer 0
    new = {}
    for module in model:  # what accelerate's FSDP2 prepare does: new parameters, the optimizer re-pointed
        for name, p in list(module.named_parameters(recurse=False)):
            new[id(p)] = torch.nn.Parameter(p.detach().clone())
            setattr(module, name, new[id(p)])
    for group in optimizer.param_groups:
        group["params"] = [new[id(p)] for p in group["params"]]
    stepped = stepped_parameters(model, optimizer)
    assert [id(p) for p in stepped] == [id(new[id(p)]) for p in old[2:]]  # layers 1 and 2, in the model's order
    assert not any(p is q for p in stepped for q in old)
    optimizer.add_param_group({"params": [new[id(p)] for p in old[:2]]})
    assert stepped_parameters(model, optimizer) == list(model.parameters())  # accelerate's test: by identity


def test_stages_read_by_a_reader_process_train_the_same_weights(tmp_path, source_dir, corpus, straight, monkeypatch):
    """`data.reader: process` (what auto is beside a GPU) through a whole staged run, a stage switch and
    checkpoints included: the weights of the run read by a thread (auto on the CPU)."""
    from safetensors.torch import load_file

    import t2r.train.batches as batches

    epochs, read = [], batches.in_reader_process
    monkeypatch.setattr(batches, "in_reader_process", lambda *a: epochs.append(a[1:3]) or read(*a))
    finetune(staged(tmp_path, source_dir, corpus, run="process", **{"data.reader": "process"}))
    assert len(epochs) >= 3  # a reader for each stage at least
    a = load_file(Path(straight[0].checkpoint.dir) / "final" / "model.safetensors")
    b = load_file(tmp_path / "process" / "final" / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=0, msg=name)
