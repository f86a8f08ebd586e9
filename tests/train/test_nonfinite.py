"""Non-finite losses are caught: a step whose loss or gradient norm is nan / inf changes no weight and is
counted, a run of them stops training with a message naming the step, nothing non-finite is saved, and
`t2r finetune` exits non-zero."""

import json
import math

import pytest
import torch
from safetensors.torch import load_file

import t2r.train.stages as stages
from t2r.cli import main
from t2r.train import NonFiniteError, finetune
from t2r.train import checkpoint as ckpt
from tests.helpers.recipes import recipe


def inject_nan(monkeypatch, steps):
    """The loss of every micro-batch of optimizer steps `steps` (1-based) becomes nan (so do the gradients)."""
    calls = {"n": 0}
    real = stages.stage_loss

    def poisoned_stage_loss(*args, **kwargs):
        loss = real(*args, **kwargs)

        def poisoned(batch):
            total, parts = loss(batch)
            calls["n"] += 1
            step = (calls["n"] - 1) // 2 + 1  # the default recipe accumulates 2 micro-batches per step
            return (total * float("nan"), parts) if step in steps else (total, parts)

        return poisoned

    monkeypatch.setattr(stages, "stage_loss", poisoned_stage_loss)


def test_a_few_nan_steps_are_skipped_and_change_nothing(tmp_path, source_dir, corpus, monkeypatch):
    inject_nan(monkeypatch, {2, 3})
    seen = []
    r = recipe(tmp_path, source_dir, corpus, **{"train.max_nonfinite_steps": 3, "checkpoint.every_steps": 1,
                                                 "checkpoint.keep_last": 6})
    final = finetune(r, callbacks=[seen.append])
    assert [m.get("skipped", False) for m in seen] == [False, True, True, False, False, False]
    assert seen[1]["loss"] is None and seen[1]["grad_norm"] is None and final["skipped_steps"] == 2
    weights = {s: load_file(f"{r.checkpoint.dir}/step-{s:08d}/model.safetensors") for s in (1, 2, 3, 4)}
    for name in weights[1]:  # steps 2 and 3 left the weights as step 1 did; step 4 trained again
        assert torch.equal(weights[2][name], weights[1][name]) and torch.equal(weights[3][name], weights[1][name])
    assert any(not torch.equal(weights[4][n], weights[1][n]) for n in weights[1])
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[1] == {**rows[1], "loss": None, "skipped": True}  # valid JSON: null, never NaN
    assert all(math.isfinite(v) for v in load_file(f"{r.checkpoint.dir}/final/model.safetensors")["lm_head.weight"]
               .flatten().tolist())


def test_nan_steps_in_a_row_stop_the_run_and_nothing_nan_is_saved(tmp_path, source_dir, corpus, monkeypatch):
    inject_nan(monkeypatch, set(range(2, 100)))
    r = recipe(tmp_path, source_dir, corpus, **{"train.max_nonfinite_steps": 3, "train.max_steps": 12})
    with pytest.raises(NonFiniteError, match=r"step 4: loss nan, gradient norm nan: 3 non-finite steps in a row "
                                             r"\(steps 2-4, updates skipped; train.max_nonfinite_steps=3\)"):
        finetune(r)
    assert [p.name for p in ckpt.checkpoints(r.checkpoint.dir)] == ["step-00000003"]  # finite: saved at step 3
    assert not (tmp_path / "run" / "final").exists()


def test_a_diverging_lr_fails_the_command(tmp_path, source_dir, corpus, capsys):
    """train.lr=1e3 (the issue's probe): the loss turns nan; before, final/ was all nan with exit code 0."""
    recipe(tmp_path, source_dir, corpus)  # writes run.yaml
    code = main(["finetune", "--config", str(tmp_path / "run.yaml"), "train.lr=1e3", "train.max_steps=30",
                 "train.max_nonfinite_steps=3"])
    assert code == 1
    err = capsys.readouterr().err
    assert "t2r finetune: error: step " in err and ("non-finite steps in a row" in err or "no longer finite" in err)
    assert not (tmp_path / "run" / "final").exists()
    for found in ckpt.checkpoints(tmp_path / "run"):
        for name, value in load_file(found / "model.safetensors").items():
            assert torch.isfinite(value).all(), (found.name, name)



def test_an_update_that_overflows_the_weights_is_never_saved(tmp_path, source_dir, corpus, monkeypatch):
    """Loss and gradients of step 2 are finite, but its update leaves an inf in the weights (as an lr far
    too large can): the checkpoint of step 2 is refused, and so is final/; step 1's stays."""

    class Overflowing(torch.optim.AdamW):
        steps = 0

        def step(self, closure=None):
            super().step(closure)
            Overflowing.steps += 1
            if Overflowing.steps == 2:
                with torch.no_grad():
                    self.param_groups[0]["params"][0].view(-1)[0] = float("inf")

    monkeypatch.setattr(torch.optim, "AdamW", Overflowing)
    r = recipe(tmp_path, source_dir, corpus, **{"checkpoint.every_steps": 1})
    with pytest.raises(NonFiniteError, match="step 2: the weights are no longer finite, so they were not saved"):
        finetune(r)
    assert [p.name for p in ckpt.checkpoints(r.checkpoint.dir)] == ["step-00000001"]
    assert not (tmp_path / "run" / "final").exists()
