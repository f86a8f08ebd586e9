"""Cross-field recipe checks (`t2r.train.checks`): a run's name stays a folder below checkpoint.dir's parent."""

import pytest

from t2r.train.recipe import RecipeError
from tests.helpers.recipes import make_recipe as make


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
