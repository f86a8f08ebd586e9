"""A full disk while a checkpoint or final/ is written: one line naming the run directory and the fix, the half
copy deleted, the previous checkpoint intact, and `--resume` (space freed) ends with the weights of a run never
interrupted. Before: a traceback, once `RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos
422848 vs 422740`, naming no disk."""

import errno

import accelerate.checkpointing
import pytest
import torch
import transformers

from t2r.cli import main
from t2r.train import checkpoint as ckpt
from t2r.train import finetune
from tests.helpers.recipes import final_weights, recipe

TORCH_SHORT_WRITE = "[enforce fail at inline_container.cc:672] . unexpected pos 422848 vs 422740"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, source_dir, corpus):
    r = recipe(tmp_path_factory.mktemp("straight"), source_dir, corpus)
    finetune(r)
    return final_weights(r)


def full_disk_on_optimizer(monkeypatch, calls_before: int):
    """accelerate's save of the optimizer fails as torch does on a full disk, after `calls_before` saves."""
    real, seen = accelerate.checkpointing.save, {"n": 0}

    def save(obj, path, *args, **kwargs):
        if str(path).endswith("optimizer.bin"):
            seen["n"] += 1
            if seen["n"] > calls_before:
                with open(path, "wb") as fh:
                    fh.write(b"\0" * 1000)  # the part that fit
                raise RuntimeError(TORCH_SHORT_WRITE)
        return real(obj, path, *args, **kwargs)

    monkeypatch.setattr(accelerate.checkpointing, "save", save)


def test_a_full_disk_during_a_checkpoint_is_one_line_and_resumes_exactly(tmp_path, source_dir, corpus, capsys,
                                                                         monkeypatch, uninterrupted):
    recipe(tmp_path, source_dir, corpus)
    full_disk_on_optimizer(monkeypatch, calls_before=1)  # step 3 saves, step 6 finds the disk full
    capsys.readouterr()
    assert main(["finetune", "--config", str(tmp_path / "run.yaml")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert (f"t2r finetune: error: no space left on the disk of {tmp_path / 'run'} while writing checkpoint "
            f"step-00000006 ({TORCH_SHORT_WRITE}); the newest checkpoint, step-00000003, is intact: free space there "
            "(or set checkpoint.dir to a larger disk), then --resume") in err
    assert [p.name for p in (tmp_path / "run").iterdir() if p.name.startswith(".tmp")] == []
    assert [c.name for c in ckpt.checkpoints(tmp_path / "run")] == ["step-00000003"]
    monkeypatch.undo()
    assert main(["finetune", "--config", str(tmp_path / "run.yaml"), "--resume"]) == 0
    for name, value in uninterrupted.items():
        assert torch.equal(final_weights(recipe(tmp_path, source_dir, corpus))[name], value), name


def test_a_full_disk_while_writing_final_is_one_line(tmp_path, source_dir, corpus, capsys, monkeypatch):
    def no_space(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", no_space)
    recipe(tmp_path, source_dir, corpus)
    capsys.readouterr()
    assert main(["finetune", "--config", str(tmp_path / "run.yaml")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "while writing the final model ([Errno 28] No space left on device); the " \
        "checkpoints are intact: free space there" in err
    assert not (tmp_path / "run" / ".tmp-final").exists() and not (tmp_path / "run" / "final").exists()
