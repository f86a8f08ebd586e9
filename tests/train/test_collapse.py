"""A collapsed model is never saved as a success: a loss far above the stage's first, or a next-token loss back at
ln(vocab) after the stage learned better, writes no checkpoint, stops the run after
`train.max_collapsed_steps` in a row, and a held-out loss at ln(vocab) after such a step writes no final/."""

import math

import pytest

import t2r.train.stages as stages
from t2r.cli import main
from t2r.train import CollapseError, finetune
from t2r.train import checkpoint as ckpt
from t2r.train.guard import CollapseGuard, collapsed_model
from tests.helpers.recipes import recipe


def test_the_guard_flags_a_jump_and_a_fall_back_to_uniform():
    record = {}
    guard = CollapseGuard(97, limit=3, record=record)
    assert guard.check(1, 4.6, 4.6) is None  # a random model starts at a uniform guess: not a collapse
    assert guard.check(2, 3.0, 3.0) is None and record["best_next_token"] == 3.0
    assert "a uniform guess (ln vocab = 4.575" in guard.check(3, math.log(97), math.log(97))
    assert "more than double the stage's first 4.6" in guard.check(4, 50.0, None)
    with pytest.raises(CollapseError, match=r"step 5: .*collapsed \(3 such steps in a row, steps 3-5; "
                                            r"train.max_collapsed_steps=3\); no checkpoint was written since step 2"):
        guard.check(5, 4.58, 4.58)
    kl = CollapseGuard(97, limit=3, record={})
    assert kl.check(1, 0.05, None) is None and kl.check(2, 0.9, None) is None  # +1 nat at least
    assert kl.check(3, 4.0, None) is not None
    assert collapsed_model(4.56, 97, [{"collapsed_steps": 1}]) and not collapsed_model(4.56, 97, [{"start": 4.6}])
    assert not collapsed_model(3.0, 97, [{"collapsed_steps": 1}])


def test_a_lr_that_collapses_the_model_fails_the_command_without_final(tmp_path, source_dir, corpus, capsys):
    """The issue's probe: train.lr=1e3 over 12 steps skipped steps but exited 0 with validation loss ln(vocab)."""
    recipe(tmp_path, source_dir, corpus)  # writes run.yaml
    code = main(["finetune", "--config", str(tmp_path / "run.yaml"), "train.lr=1e3", "train.max_steps=12"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "t2r finetune: error: " in err and "the model has collapsed" in err
    assert not (tmp_path / "run" / "final").exists()


def test_distill_at_a_collapsing_lr_fails_too(tmp_path, source_dir, corpus, capsys):
    """stages.distill.lr=1e3: no step is skipped, the KL jumps from ~0 to ~ln(vocab)."""
    recipe(tmp_path, source_dir, corpus)
    code = main(["finetune", "--config", str(tmp_path / "run.yaml"), "train.max_steps=null",
                 "stages=[{name: distill, loss: kl, steps: 12, lr: 2.0e-3, warmup_steps: 2}]", "stages.distill.lr=1e3"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "collapse" in err and not (tmp_path / "run" / "final").exists()


def test_collapsed_steps_write_no_checkpoint_and_stop_the_run(tmp_path, source_dir, corpus, monkeypatch):
    """A loss 100x its start from step 4 on: the checkpoint of step 4 is not written, the run stops after 5 such steps
    with the step-3 checkpoint as the newest, and no final/."""
    calls = {"n": 0}
    real = stages.stage_loss

    def jumping(*args, **kwargs):
        loss = real(*args, **kwargs)

        def jumped(batch):
            total, parts = loss(batch)
            calls["n"] += 1
            return (total * 100, parts) if (calls["n"] - 1) // 2 + 1 >= 4 else (total, parts)

        return jumped

    monkeypatch.setattr(stages, "stage_loss", jumping)
    r = recipe(tmp_path, source_dir, corpus, **{"train.max_steps": 12, "checkpoint.every_steps": 1,
                                                 "checkpoint.keep_last": 20})
    with pytest.raises(CollapseError, match=r"step 8: loss .*, more than double the stage's first .*steps 4-8"):
        finetune(r)
    assert [c.name for c in ckpt.checkpoints(r.checkpoint.dir)] == [f"step-{s:08d}" for s in (1, 2, 3)]
    assert not (tmp_path / "run" / "final").exists()


def test_a_held_out_loss_back_at_uniform_is_caught_whatever_the_stage_loss():
    """A KL-only stage records no next-token loss: the held-out loss before training is the reference."""
    uniform = math.log(97)
    assert "where the model before training had 2.0000: the model has collapsed" in collapsed_model(
        uniform, 97, [{"start": 0.05}], start=2.0)
    assert not collapsed_model(uniform, 97, [{"start": 0.05}], start=uniform)  # a random model: nothing to lose
    assert not collapsed_model(2.5, 97, [{"start": 0.05}], start=2.0)


def test_a_kl_only_run_that_ends_at_uniform_writes_no_final(tmp_path, source_dir, corpus, monkeypatch):
    """The issue's SmolLM2 probe (pure KL at lr 1e3: exit 0, held-out loss ln(vocab)), on the tiny random model
    (held-out ~ uniform from the start), told that the model before training did better."""
    monkeypatch.setattr(stages, "_held_out_start", lambda *args: 1.0)
    r = recipe(tmp_path, source_dir, corpus, **{"train.max_steps": "null",
                                                 "stages": "[{name: distill, loss: kl, steps: 3, lr: 1.0e-4}]"})
    with pytest.raises(CollapseError, match=r"held-out loss .* is a uniform guess .* where the model before training "
                                            r"had 1.0000: the model has collapsed; final/ was not written"):
        finetune(r)
    assert not (tmp_path / "run" / "final").exists()
    assert ckpt.read_state(ckpt.latest(r.checkpoint.dir))["held_out_start"] == 1.0
