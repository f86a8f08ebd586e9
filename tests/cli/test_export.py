"""`t2r export`: a step checkpoint of a run cut short becomes a model directory like `final/`."""

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from t2r import manifest
from t2r.cli import main
from t2r.train import finetune
from tests.helpers.recipes import recipe


@pytest.mark.parametrize("overrides", [{}, {"train.trainable": "lora", "lora.r": 4}])
def test_the_last_checkpoint_exports_as_the_final_model(tmp_path, source_dir, corpus, capsys, overrides):
    """The checkpoint written at the last step holds the weights final/ holds: exported, they are equal tensor for
    tensor (a LoRA run's adapters merged as in final/), with a manifest, a model card and the recipe; a second
    export to the same place is refused, and a run directory exports its newest checkpoint."""
    tiny = recipe(tmp_path, source_dir, corpus, **overrides)
    finetune(tiny)
    run = tmp_path / "run"
    last = sorted(run.glob("step-*"))[-1]
    assert main(["export", str(last), "--out", str(tmp_path / "exported")]) == 0
    exported = load_file(tmp_path / "exported" / "model.safetensors")
    final = load_file(run / "final" / "model.safetensors")
    assert exported.keys() == final.keys() and all(torch.equal(exported[k], final[k]) for k in final)
    assert manifest.verify_model_dir(tmp_path / "exported")
    assert (tmp_path / "exported" / "recipe.yaml").is_file()
    assert "| trained | 6 steps, 768 tokens of" in (tmp_path / "exported" / "README.md").read_text()
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "exported").config.t2r_mixers == ["gsa"] * 3
    assert main(["export", str(last), "--out", str(tmp_path / "exported")]) == 2
    assert "exists: give another --out" in capsys.readouterr().err
    assert main(["export", str(run)]) == 0  # the newest intact checkpoint, next to it
    assert (run / f"export-{last.name}" / "config.json").is_file()


def test_a_damaged_checkpoint_is_refused_by_name(tmp_path, source_dir, corpus, capsys):
    tiny = recipe(tmp_path, source_dir, corpus)
    finetune(tiny)
    last = sorted((tmp_path / "run").glob("step-*"))[-1]
    data = bytearray((last / "model.safetensors").read_bytes())
    data[-10] ^= 0xFF
    (last / "model.safetensors").write_bytes(bytes(data))
    assert main(["export", str(last), "--out", str(tmp_path / "x")]) == 1
    assert "model.safetensors" in capsys.readouterr().err and not (tmp_path / "x").exists()
