"""t2r.dtypes: the one table of dtype names, shared by the command line, recipes and evaluation."""
import pytest
import torch

from t2r.dtypes import DTYPE_NAMES, torch_dtype


def test_every_name_maps_to_its_torch_dtype_and_others_are_refused():
    assert [torch_dtype(n) for n in DTYPE_NAMES] == [torch.float32, torch.bfloat16, torch.float16]
    with pytest.raises(ValueError, match="float32, bfloat16, float16"):
        torch_dtype("fp8")


def test_command_line_recipes_and_evaluation_read_the_same_table():
    from t2r import cli
    from t2r.eval.models import eval_dtype
    from t2r.train import recipe

    assert cli.DTYPES == ("auto", *DTYPE_NAMES) and recipe.DTYPES == DTYPE_NAMES
    assert [eval_dtype(n, "cpu") for n in DTYPE_NAMES] == list(DTYPE_NAMES)
