"""The CPU walk-through notebook runs top to bottom (its code cells, in order, in one namespace)."""

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_walkthrough_runs():
    notebook = json.loads((Path(__file__).parents[1] / "notebooks" / "walkthrough.ipynb").read_text())
    namespace: dict = {}
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            exec(compile("".join(cell["source"]), "walkthrough.ipynb", "exec"), namespace)
    assert namespace["hybrid"].config.t2r_mixers.count("softmax") == 15
