"""peft adapter directories through t2r's loaders: one `t2r.save_adapter` wrote is checked against its manifest,
and an adapter whose base leads back to it, a pickle holding more than tensors, or non-finite weights are one line
(before: 200 flipped bytes generated garbage with exit 0, a RecursionError, torch's weights_only text)."""

import json
import shutil

import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file

import t2r
from t2r.cli import main
from t2r.manifest import MANIFEST, DamagedModelError
from t2r.sources import load_source
from tests.helpers.data import word_tokenizer
from tests.helpers.models import tiny_source
from tests.test_model_check import flip_bytes


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(base directory, adapter directory written by t2r.save_adapter) of a tiny converted model."""
    tmp = tmp_path_factory.mktemp("adapters")
    t2r.save_converted(t2r.convert(tiny_source("llama"), "gsa", num_slots=8), word_tokenizer(), tmp / "base")
    peft = get_peft_model(t2r.convert(tiny_source("llama"), "gsa", num_slots=8),
                          LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(0)
    with torch.no_grad():  # trained-looking adapters (lora_B starts at zero)
        for name, param in peft.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.02)
    t2r.save_adapter(peft, tmp / "adapter", base=str(tmp / "base"))
    return tmp / "base", tmp / "adapter"


def copy_of(adapter, tmp_path, **config):
    """A copy of `adapter` without its manifest (as peft itself saves), with `config` set in adapter_config.json."""
    copy = tmp_path / "copy"
    shutil.copytree(adapter, copy)
    (copy / MANIFEST).unlink()
    (copy / "t2r_adapter.json").unlink()
    path = copy / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return copy


def one_line_error(capsys, argv) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


def generate(model) -> list[str]:
    return ["generate", "--model", str(model), "--prompt", "w5", "--max-new-tokens", "2", "--device", "cpu"]


def test_save_adapter_writes_a_manifest_and_flipped_bytes_are_refused(saved, tmp_path, capsys):
    base, adapter = saved
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == str(base)
    assert {"adapter_model.safetensors", "adapter_config.json"} <= set(json.loads((adapter / MANIFEST).read_text())
                                                                      ["files"])
    load_source(str(adapter))
    damaged = tmp_path / "adapter"
    shutil.copytree(adapter, damaged)
    flip_bytes(damaged / "adapter_model.safetensors", 200)
    with pytest.raises(DamagedModelError, match="adapter_model.safetensors does not match its SHA-256"):
        load_source(str(damaged))
    assert "adapter_model.safetensors does not match" in one_line_error(capsys, generate(damaged))
    assert "adapter_model.safetensors does not match" in one_line_error(
        capsys, ["eval", "--model", str(damaged), "--baseline", "none", "--suites", "ppl", "--device", "cpu",
                 "--out", str(tmp_path / "eval")])
    (damaged / MANIFEST).unlink()  # deleting the manifest does not turn the check off
    with pytest.raises(DamagedModelError, match="manifest.json is missing, yet t2r_adapter.json says t2r wrote"):
        load_source(str(damaged))


def test_save_adapter_refuses_an_adapter_without_a_base(saved, tmp_path):
    peft = get_peft_model(t2r.convert(tiny_source("llama"), "gsa", num_slots=8),
                          LoraConfig(r=2, target_modules=["q_proj"]))
    with pytest.raises(ValueError, match="pass base='<converted model directory or hub id>' to save_adapter"):
        t2r.save_adapter(peft, tmp_path / "adapter")
    assert not (tmp_path / "adapter").exists()


def test_an_adapter_whose_base_leads_back_to_it_is_one_line(saved, tmp_path, capsys):
    """Before: RecursionError after a thousand frames."""
    _, adapter = saved
    itself = copy_of(adapter, tmp_path)
    config = json.loads((itself / "adapter_config.json").read_text())
    (itself / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": str(itself)}))
    assert "names " + str(itself) + " as its base model, which leads back to this adapter" in one_line_error(
        capsys, generate(itself))
    other = tmp_path / "other"  # two adapters, each the other's base
    shutil.copytree(itself, other)
    (other / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": str(itself)}))
    (itself / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": str(other)}))
    with pytest.raises(ValueError, match="leads back to this adapter"):
        load_source(str(other))


def test_a_pickled_adapter_holding_more_than_tensors_is_one_line(saved, tmp_path, capsys):
    """Before: torch's weights_only text (eight lines under a traceback)."""
    _, adapter = saved
    pickled = copy_of(adapter, tmp_path)
    state = load_file(pickled / "adapter_model.safetensors")
    (pickled / "adapter_model.safetensors").unlink()
    torch.save(state, pickled / "adapter_model.bin")  # tensors only: torch's weights_only load reads it
    load_source(str(pickled))
    torch.save({**state, "extra": np.zeros(2)}, pickled / "adapter_model.bin")
    err = one_line_error(capsys, generate(pickled))
    assert "the adapter's pickle holds more than tensors" in err and "save the adapter as safetensors" in err


def test_an_adapter_with_nan_is_refused(saved, tmp_path):
    _, adapter = saved
    broken = copy_of(adapter, tmp_path)
    state = load_file(broken / "adapter_model.safetensors")
    name = sorted(state)[0]
    state[name][0, 0] = float("nan")
    save_file(state, broken / "adapter_model.safetensors")
    with pytest.raises(DamagedModelError, match="copy: .* holds nan or inf after loading: .*restore the adapter"):
        load_source(str(broken))


def test_an_adapter_peft_saved_loads_with_a_warning_that_nothing_checked_its_files(saved, tmp_path):
    """An adapter without t2r's manifest (peft's own save_pretrained) is not refused, but not silent either: it
    says its files went unchecked; one t2r wrote loads without a word."""
    import warnings

    _, adapter = saved
    with pytest.warns(UserWarning, match="an adapter without t2r's manifest .*t2r.save_adapter writes one"):
        load_source(str(copy_of(adapter, tmp_path)))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*without t2r's manifest")
        load_source(str(adapter))


def test_the_command_line_says_the_unchecked_adapter_in_one_note(saved, tmp_path):
    """Through `t2r generate`, the library's warning is one `note:` line, not a Python warning with its source line."""
    import os
    import subprocess
    import sys

    _, adapter = saved
    done = subprocess.run([sys.executable, "-m", "t2r.cli", *generate(copy_of(adapter, tmp_path))],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert done.returncode == 0, done.stderr
    notes = [line for line in done.stderr.splitlines() if "without t2r's manifest" in line]
    assert len(notes) == 1 and notes[0].startswith("note: ") and "UserWarning" not in done.stderr, done.stderr
