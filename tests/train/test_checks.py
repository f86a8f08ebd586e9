"""Cross-field recipe checks (`t2r.train.checks`): a run's name stays a folder below checkpoint.dir's parent; rows
fit the positions the source was trained on."""

import pytest

from t2r.cli import main
from t2r.train import finetune
from t2r.train.recipe import RecipeError
from tests.helpers.recipes import make_recipe as make
from tests.helpers.recipes import recipe


@pytest.mark.parametrize("name", ["../../escape", "..", "/abs/run", "~/run", "a/../../b", ".", "./"])
def test_a_name_that_leaves_runs_or_is_absolute_is_refused(name):
    with pytest.raises(RecipeError) as info:
        make(f"name={name}", check_files=False)
    message = str(info.value)
    assert message.startswith(f"name: {name!r} would put the run's directory outside runs/ (checkpoint.dir is ")
    assert "use a plain name such as 'my-run'" in message and "\n" not in message


@pytest.mark.parametrize("name", ["my-run", "group/run_2", "v1.5"])
def test_plain_names_and_subfolders_pass(name):
    assert make(f"name={name}", check_files=False).checkpoint.dir == f"runs/{name}"


def test_rows_longer_than_the_source_positions_are_refused_before_training(tmp_path, source_dir, corpus, capsys):
    """Before: data.seq_len=512 on a source of 256 positions trained without a word."""
    expected = (f"data.seq_len: 512 tokens a row, longer than the 256 positions {source_dir} was trained on "
                "(max_position_embeddings); lower it to 256 or less")
    with pytest.raises(RecipeError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        finetune(recipe(tmp_path, source_dir, corpus, **{"data.seq_len": 512, "train.tokens_per_step": 1024,
                                                          "data.held_out": 0}))
    assert not (tmp_path / "run").exists()
    assert main(["finetune", "--config", str(tmp_path / "run.yaml"), "--dry-run", "data.seq_len=512",
                 "train.tokens_per_step=1024", "data.held_out=0"]) == 2
    assert capsys.readouterr().err == f"t2r finetune: error: {expected}\n"
    staged = recipe(tmp_path, source_dir, corpus, **{"stages": "[{name: a, loss: next_token, steps: 1}, "
                                                                "{name: b, loss: next_token, steps: 1, seq_len: 64}]",
                                                     "train.max_steps": "null"})
    staged.stages[1].seq_len = 512
    staged.train.tokens_per_step = 1024
    with pytest.raises(RecipeError, match=r"stages\[1\] \(b\).seq_len: 512 tokens a row, longer than the 256"):
        finetune(staged)
