"""Checkpoints are verified before they are trusted, never run code from disk, and are resumed only by
the recipe that made them: a damaged newest checkpoint falls back to the one before (which then resumes to
the same weights as an uninterrupted run), a pickle payload never executes, and a changed recipe is refused
field by field, or applied where the field may change mid-run."""

import io
import json
import math
import pickle
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from t2r.manifest import DamagedModelError, sha256
from t2r.sources import load_source
from t2r.train import CheckpointError, finetune
from t2r.train import checkpoint as ckpt
from t2r.train.safe_load import RestrictedUnpickler, no_code_from_disk
from tests.helpers.recipes import final_weights, recipe


class Payload:
    """Unpickling this creates `marker`: proof that code from the file ran."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


@pytest.fixture(scope="module")
def finished(tmp_path_factory, source_dir, corpus):
    """A finished 6-step run (checkpoints step-3 and step-6) and its final weights."""
    r = recipe(tmp_path_factory.mktemp("finished"), source_dir, corpus)
    finetune(r)
    return Path(r.checkpoint.dir), final_weights(r)


def copy_run(finished, tmp_path, source_dir, corpus, **overrides):
    """The finished run copied to `tmp_path/run` without its final model, and a recipe for the copy."""
    shutil.copytree(finished[0], tmp_path / "run")
    shutil.rmtree(tmp_path / "run" / "final")
    return recipe(tmp_path, source_dir, corpus, **overrides)


def flip_bytes(path):
    data = bytearray(path.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 1000):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


DAMAGE = {
    "deleted model": (lambda d: (d / "model.safetensors").unlink(), "model.safetensors is missing"),
    "truncated optimizer": (lambda d: (d / "optimizer.bin").write_bytes((d / "optimizer.bin").read_bytes()[:100]),
                            "optimizer.bin is 100 bytes, "),
    "1000 flipped bytes": (lambda d: flip_bytes(d / "model.safetensors"),
                           "model.safetensors does not match its SHA-256 checksum"),
    "deleted state": (lambda d: (d / ckpt.STATE_FILE).unlink(), "trainer_state.json is missing"),
    "deleted manifest": (lambda d: (d / ckpt.MANIFEST).unlink(), "manifest.json is missing"),
    "added file": (lambda d: (d / "extra.bin").write_bytes(b"x"), "extra.bin is not in manifest.json"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_latest_checkpoint_falls_back_to_the_one_before(tmp_path, source_dir, corpus, finished, damage,
                                                                   capsys):
    r = copy_run(finished, tmp_path, source_dir, corpus)
    harm, message = DAMAGE[damage]
    harm(tmp_path / "run" / "step-00000006")
    finetune(r, resume=True)
    out = capsys.readouterr().out
    assert f"checkpoint step-00000006 is damaged: {message}" in out
    assert "resumed from" in out and "step 3," in out
    assert (tmp_path / "run" / "damaged" / "step-00000006").is_dir()  # kept for inspection, out of the rotation
    for name, value in finished[1].items():  # steps 4-6 redone: the same weights as the uninterrupted run
        torch.testing.assert_close(final_weights(r)[name], value, rtol=0, atol=0, msg=name)


def test_no_intact_checkpoint_refuses_to_resume(tmp_path, source_dir, corpus, finished):
    r = copy_run(finished, tmp_path, source_dir, corpus)
    for step in ("step-00000003", "step-00000006"):
        flip_bytes(tmp_path / "run" / step / "optimizer.bin")
    damaged = r"no intact checkpoint in .* to resume from \(step-00000006, step-00000003 damaged"
    with pytest.raises(CheckpointError, match=damaged):
        finetune(r, resume=True)
    assert not (tmp_path / "run" / "final").exists()


def test_final_carries_a_manifest_and_loading_refuses_it_damaged(tmp_path, finished):
    """Before, 1,000 flipped bytes in final/model.safetensors loaded without a word (generate gave garbage)."""
    final = tmp_path / "final"
    shutil.copytree(finished[0] / "final", final)
    listed = json.loads((final / ckpt.MANIFEST).read_text())["files"]
    assert {"model.safetensors", "config.json", "recipe.yaml", "tokenizer.json"} <= set(listed)
    load_source(str(final))
    flip_bytes(final / "model.safetensors")
    with pytest.raises(DamagedModelError, match="final is damaged: model.safetensors does not match its SHA-256"):
        load_source(str(final))


def test_a_pickle_payload_in_a_checkpoint_never_runs(tmp_path, source_dir, corpus, finished, capsys):
    """accelerate restores `custom_checkpoint_0.pkl` with weights_only=False. Dropped into the newest
    checkpoint (even listed in its manifest), it makes that checkpoint refused: the run resumes from the
    one before and the payload's marker file is never created."""
    r = copy_run(finished, tmp_path, source_dir, corpus)
    marker = tmp_path / "pwned"
    newest = tmp_path / "run" / "step-00000006"
    torch.save(Payload(marker), newest / "custom_checkpoint_0.pkl")
    manifest = json.loads((newest / ckpt.MANIFEST).read_text())
    manifest["files"]["custom_checkpoint_0.pkl"] = {"size": (newest / "custom_checkpoint_0.pkl").stat().st_size,
                                                    "sha256": sha256(newest / "custom_checkpoint_0.pkl")}
    (newest / ckpt.MANIFEST).write_text(json.dumps(manifest))
    finetune(r, resume=True)
    assert "custom_checkpoint_0.pkl can only be restored by unpickling" in capsys.readouterr().out
    assert not marker.exists()


def test_a_payload_behind_a_valid_checksum_is_refused_on_load(tmp_path, source_dir, corpus, finished):
    """Someone who can also rewrite the manifest: the optimizer file replaced by a payload with a matching
    checksum. Loading is weights-only, so it fails with a message and the payload does not run."""
    r = copy_run(finished, tmp_path, source_dir, corpus)
    marker = tmp_path / "pwned"
    newest = tmp_path / "run" / "step-00000006"
    torch.save({"state": Payload(marker)}, newest / "optimizer.bin")
    manifest = json.loads((newest / ckpt.MANIFEST).read_text())
    manifest["files"]["optimizer.bin"] = {"size": (newest / "optimizer.bin").stat().st_size,
                                          "sha256": sha256(newest / "optimizer.bin")}
    (newest / ckpt.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="cannot resume from .*step-00000006: UnpicklingError"):
        finetune(r, resume=True)
    assert not marker.exists()


def test_no_code_from_disk_guards_torch_load_and_checkpoint_metadata(tmp_path):
    import torch.distributed.checkpoint as dcp

    marker = tmp_path / "pwned"
    torch.save(Payload(marker), tmp_path / "payload.pt")
    with no_code_from_disk(), pytest.raises(pickle.UnpicklingError):
        torch.load(tmp_path / "payload.pt", weights_only=False)  # what accelerate asks for custom objects
    with pytest.raises(pickle.UnpicklingError, match="refused to unpickle pathlib.Path.touch"):
        RestrictedUnpickler(io.BytesIO(pickle.dumps(Payload(marker)))).load()
    assert not marker.exists()
    # FSDP's sharded checkpoints (torch.distributed.checkpoint) still load: metadata and bytes items
    state = {"w": torch.arange(6.0).reshape(2, 3), "step": 7, "betas": (0.9, 0.95)}
    dcp.save(state, checkpoint_id=tmp_path / "dcp")
    loaded = {"w": torch.zeros(2, 3), "step": 0, "betas": (0.0, 0.0)}
    with no_code_from_disk():
        dcp.load(loaded, checkpoint_id=tmp_path / "dcp")
    assert torch.equal(loaded["w"], state["w"]) and loaded["step"] == 7 and tuple(loaded["betas"]) == (0.9, 0.95)
    with open(tmp_path / "dcp" / ".metadata", "wb") as fh:
        pickle.dump(Payload(marker), fh)
    with no_code_from_disk(), pytest.raises(BaseException, match="refused to unpickle pathlib.Path.touch"):
        dcp.load(loaded, checkpoint_id=tmp_path / "dcp")  # torch wraps it in a CheckpointException (BaseException)
    assert not marker.exists()


def test_resume_refuses_a_changed_recipe_and_applies_allowed_changes(tmp_path, source_dir, corpus, finished,
                                                                      capsys):
    changed = copy_run(finished, tmp_path, source_dir, corpus, **{"data.seq_len": 64, "train.seed": 1,
                                                                  "train.max_steps": 8})
    with pytest.raises(CheckpointError) as info:
        finetune(changed, resume=True)
    message = str(info.value)
    assert "in fields that cannot change mid-run:\n  data.seq_len: 32 -> 64\n  train.seed: 0 -> 1\n" in message
    assert "train.max_steps" not in message and not (tmp_path / "run" / "final").exists()

    metrics = []
    allowed = recipe(tmp_path, source_dir, corpus, **{"train.max_steps": 8, "train.lr": 1e-3})
    finetune(allowed, resume=True, callbacks=[metrics.append])
    assert "--resume: train.lr changed from 0.003 to 0.001; applied from step 7" in capsys.readouterr().out
    assert [m["step"] for m in metrics] == [7, 8]
    # step 7 uses the new peak lr on the new 8-step cosine (warmup 2): progress (6 - 2) / (8 - 2)
    assert metrics[0]["lr"] == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 4 / 6))))
    state = ckpt.read_state(ckpt.latest(allowed.checkpoint.dir))
    assert {"step": 6, "field": "train.lr", "from": 0.003, "to": 0.001} in state["recipe_changes"]
    assert {"step": 6, "field": "train.max_steps", "from": 6, "to": 8} in state["recipe_changes"]
    for saved in (tmp_path / "run" / "recipe.yaml", tmp_path / "run" / "final" / "recipe.yaml"):
        assert yaml.safe_load(saved.read_text())["train"]["lr"] == 1e-3
    # the optimizer really trains with the new lr (the old scheduler restored its own): the same two extra
    # steps with the old lr end elsewhere
    other = tmp_path / "other"
    other.mkdir()
    same_lr = copy_run(finished, other, source_dir, corpus, **{"train.max_steps": 8})
    finetune(same_lr, resume=True)
    assert any(not torch.equal(final_weights(same_lr)[n], w) for n, w in final_weights(allowed).items())


def test_data_edited_in_place_is_refused_on_resume(tmp_path, source_dir, corpus, finished):
    """Before, the resume exited 0 and its final weights differed from an uninterrupted run's."""
    data = tmp_path / "corpus.jsonl"
    shutil.copy(corpus, data)
    r = recipe(tmp_path, source_dir, data, run="own", **{"train.max_steps": 3})
    finetune(r)
    state = ckpt.read_state(ckpt.latest(r.checkpoint.dir))
    assert state["data_files"] == {str(data): {"size": data.stat().st_size, "sha256": sha256(data)}}
    assert json.loads((tmp_path / "own" / "final" / "trained.json").read_text())["data_files"] == state["data_files"]
    text = data.read_text()
    data.write_text(text.replace("fox", "cat", 1))  # same size, other content
    longer = recipe(tmp_path, source_dir, data, run="own", **{"train.max_steps": 6})
    with pytest.raises(CheckpointError, match=r"the training data changed since step-00000003 was written:\n  "
                                              r".*corpus.jsonl: same size, other content"):
        finetune(longer, resume=True)
    data.write_text(text + text.splitlines()[0] + "\n")
    with pytest.raises(CheckpointError, match=r"corpus.jsonl: [\d,]+ bytes then, [\d,]+ now"):
        finetune(longer, resume=True)
    data.write_text(text)  # restored: the run continues
    assert finetune(longer, resume=True)["step"] == 6


def test_a_resume_that_trains_nothing_keeps_the_recipe_it_was_trained_with(tmp_path, source_dir, corpus, finished,
                                                                          capsys):
    """Before, max_steps lowered below the checkpoint trained nothing and final/recipe.yaml recorded the asked-for
    max_steps and lr."""
    r = copy_run(finished, tmp_path, source_dir, corpus, **{"train.max_steps": 5, "train.lr": 0.01})
    finetune(r, resume=True)
    assert "step-00000006 has trained 6 steps, the recipe asks for 5: nothing to train" in capsys.readouterr().out
    for saved in (tmp_path / "run" / "recipe.yaml", tmp_path / "run" / "final" / "recipe.yaml"):
        train = yaml.safe_load(saved.read_text())["train"]
        assert (train["max_steps"], train["lr"]) == (6, 0.003), saved
    trained = json.loads((tmp_path / "run" / "final" / "trained.json").read_text())
    assert trained["step"] == 6 and trained["recipe_changes"] == []
    for name, value in finished[1].items():
        assert torch.equal(final_weights(r)[name], value), name
