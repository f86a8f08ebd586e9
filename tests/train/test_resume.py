"""`--resume` without a checkpoint (`t2r.train.resume.check_restartable`): refused, naming the directory and the
runs beside it, and nothing deleted, unless the directory holds only what a run of the same recipe wrote before
its first checkpoint (then that run starts again: tests/train/test_run_dir.py)."""

import json

import pytest

from t2r.cli import main
from t2r.train import RunDirError, finetune, logs
from t2r.train.recipe import save_resolved
from tests.helpers.recipes import recipe


def files(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.name != ".lock")


def test_a_recipe_written_before_a_convert_field_existed_still_resumes():
    """A run's recipe.yaml without a `convert:` field added since (calibration_rows) ran with its default: no change;
    a value other than the default is one."""
    import yaml

    from t2r.train.resume import differences
    from tests.helpers.recipes import make_recipe

    current = yaml.safe_load(yaml.safe_dump(make_recipe().to_dict(), sort_keys=False))
    stored = yaml.safe_load(yaml.safe_dump(make_recipe().to_dict(), sort_keys=False))
    del stored["convert"]["calibration_rows"], stored["convert"]["calibration_length"]
    assert differences(stored, current) == []
    current["convert"]["calibration_rows"] = 8
    assert differences(stored, current) == [("convert.calibration_rows", 4, 8)]


def test_resume_in_a_directory_of_the_users_files_deletes_nothing(tmp_path, source_dir, corpus, capsys):
    recipe(tmp_path, source_dir, corpus, run="mine")
    root = tmp_path / "mine"
    for name in ("logs/notes.txt", "eval/scores.json", "recipe.yaml"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("the user's\n")
    (tmp_path / "other" / "step-00000003").mkdir(parents=True)
    before = files(root)
    assert main(["finetune", "--config", str(tmp_path / "mine.yaml"), "--resume"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert (f"--resume: no checkpoint (step-*/) in {root}: it holds eval/, which no run writes before its first "
            f"checkpoint; nothing was deleted. runs with checkpoints in {tmp_path}: {tmp_path / 'other'}. Set name "
            "(or checkpoint.dir) to the run to continue, or drop --resume") in err
    assert files(root) == before and (root / "recipe.yaml").read_text() == "the user's\n"


def test_resume_of_a_missing_directory_creates_nothing(tmp_path, source_dir, corpus):
    r = recipe(tmp_path, source_dir, corpus, run="typo")
    with pytest.raises(RunDirError, match=r"no checkpoint \(step-\*/\) in .*typo: the directory does not exist; "
                                          rf"nothing was deleted. no run in {tmp_path} has a checkpoint"):
        finetune(r, resume=True)
    assert not (tmp_path / "typo").exists()


def test_resume_beside_another_recipes_files_is_refused(tmp_path, source_dir, corpus):
    r = recipe(tmp_path, source_dir, corpus)
    save_resolved(recipe(tmp_path, source_dir, corpus, run="other", **{"train.seed": 7}), tmp_path / "run")
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(RunDirError, match=r"its recipe.yaml is another run's \(train.seed differ\)"):
        finetune(r, resume=True)
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == '{"step": 1}\n'
    (tmp_path / "run" / "recipe.yaml").unlink()
    with pytest.raises(RunDirError, match=r"it holds no recipe.yaml written by a run of t2r"):
        finetune(r, resume=True)


def test_a_cut_off_last_line_of_metrics_is_dropped_on_resume(tmp_path, source_dir, corpus, capsys):
    """Before: `--resume` stopped with a bare JSONDecodeError."""
    r = recipe(tmp_path, source_dir, corpus, **{"train.max_steps": 3})
    finetune(r)
    metrics = tmp_path / "run" / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join(lines) + '\n{"step": 4, "lo')  # killed while writing step 4's record
    capsys.readouterr()
    assert finetune(recipe(tmp_path, source_dir, corpus, **{"train.max_steps": 6}), resume=True)["step"] == 6
    assert f"{metrics}: line {len(lines) + 1} was cut off (the run stopped while writing it); dropped it" in \
        capsys.readouterr().out
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [row["step"] for row in rows if "loss" in row] == [1, 2, 3, 4, 5, 6]


def test_a_broken_line_before_the_last_is_named(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1}\n[2]\n{"step": 3}\n')
    with pytest.raises(RunDirError, match=r"metrics.jsonl: line 2 is not a metrics record \('\[2\]'\): delete or "
                                          "repair that line, then --resume again"):
        logs.read_history(metrics, 3)
    metrics.write_text('{"step": 1}\n{"step": 2}\n{"st')
    notes = []
    assert logs.read_history(metrics, 3, notes.append) == [{"step": 1}, {"step": 2}] and len(notes) == 1
    assert metrics.read_text() == '{"step": 1}\n{"step": 2}\n'
