"""`AutoModelForCausalLM.from_pretrained(dir)` of a directory t2r wrote checks it as t2r's own loaders do: before,
flipped bytes, a missing tensor, nan weights or a weights file swapped for a symbolic link loaded without a word.
Hub ids and directories t2r did not write load as before; a directory `load_source` verified is not hashed twice."""

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModel, AutoModelForCausalLM

import t2r
from t2r import manifest
from t2r.manifest import DamagedModelError
from t2r.model_dir import CONVERSION_FILE, save_converted
from t2r.models import loading
from t2r.sources import load_source, verify_ahead
from tests.helpers.data import word_tokenizer
from tests.helpers.models import tiny_source

WEIGHTS = "model.safetensors"


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A tiny GSA conversion as `t2r convert` writes it (conversion record, manifest)."""
    out = tmp_path_factory.mktemp("written") / "gsa"
    save_converted(t2r.convert(tiny_source("llama"), "gsa", num_slots=4), word_tokenizer(), out, source="tiny")
    return out


@pytest.fixture
def copy(written, tmp_path):
    shutil.copytree(written, tmp_path / "gsa")
    return tmp_path / "gsa"


def refused(directory, match, auto=AutoModelForCausalLM) -> str:
    with pytest.raises(DamagedModelError, match=match) as err:
        auto.from_pretrained(directory)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_an_intact_directory_loads_and_matches(written):
    model = AutoModelForCausalLM.from_pretrained(written)
    state = load_file(written / WEIGHTS)
    assert torch.equal(model.state_dict()["model.layers.0.mlp.down_proj.weight"],
                       state["model.layers.0.mlp.down_proj.weight"])


@pytest.mark.parametrize("auto", [AutoModelForCausalLM, AutoModel])
def test_flipped_bytes_are_refused_naming_the_file_and_the_fix(copy, auto):
    data = bytearray((copy / WEIGHTS).read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 20):
        data[i] ^= 0xFF
    (copy / WEIGHTS).write_bytes(bytes(data))
    message = refused(copy, r"gsa is damaged: model.safetensors does not match its SHA-256", auto)
    assert "t2r convert --overwrite" in message and "re-export" in message


def test_a_missing_tensor_is_refused(copy):
    state = load_file(copy / WEIGHTS)
    del state["model.layers.1.self_attn.slot_gate.weight"]
    save_file(state, copy / WEIGHTS, metadata={"format": "pt"})
    refused(copy, r"gsa is damaged: model.safetensors is [\d,]+ bytes, [\d,]+ when written")


def test_a_t2r_directory_without_its_manifest_is_refused(copy):
    (copy / manifest.MANIFEST).unlink()
    message = refused(copy, rf"gsa: manifest.json is missing, yet {CONVERSION_FILE} says t2r wrote this directory")
    assert "t2r convert --overwrite" in message


def test_a_t2r_directory_without_its_manifest_is_refused_by_load_source_too(copy):
    """Before, load_source's own check (no manifest: nothing to check) let from_pretrained skip the refusal."""
    (copy / manifest.MANIFEST).unlink()
    with pytest.raises(DamagedModelError, match=f"gsa: manifest.json is missing, yet {CONVERSION_FILE} says t2r"):
        load_source(str(copy))


def test_a_run_final_dir_without_its_manifest_is_refused(copy):
    (copy / CONVERSION_FILE).rename(copy / "recipe.yaml")  # final/ and exports hold the run's recipe instead
    (copy / manifest.MANIFEST).unlink()
    refused(copy, "gsa: manifest.json is missing, yet recipe.yaml says t2r wrote this directory")


def test_nan_weights_are_refused_naming_the_tensor(copy):
    """The manifest matches (written after the nan, as a run diverged and exported would be)."""
    state = load_file(copy / WEIGHTS)
    state["model.layers.0.mlp.up_proj.weight"][3, 1] = float("nan")
    save_file(state, copy / WEIGHTS, metadata={"format": "pt"})
    (copy / manifest.MANIFEST).unlink()
    manifest.write(copy)
    message = refused(copy, r"gsa: model.layers.0.mlp.up_proj.weight holds nan or inf after loading")
    assert "t2r convert --overwrite" in message


def test_a_symlinked_weights_file_that_does_not_match_is_named_with_its_target(copy, tmp_path):
    other = tmp_path / "other.safetensors"
    save_file(load_file(copy / WEIGHTS) | {"lm_head.weight": torch.zeros(97, 64)}, other, metadata={"format": "pt"})
    (copy / WEIGHTS).unlink()
    (copy / WEIGHTS).symlink_to(other)
    message = refused(copy, r"gsa is damaged: model.safetensors \(a symbolic link to ")
    assert str(other.resolve()) in message


def test_a_symlink_to_an_identical_copy_loads(copy, tmp_path):
    shutil.copy(copy / WEIGHTS, tmp_path / "same.safetensors")
    (copy / WEIGHTS).unlink()
    (copy / WEIGHTS).symlink_to(tmp_path / "same.safetensors")
    AutoModelForCausalLM.from_pretrained(copy)


def test_directories_t2r_did_not_write_and_hub_ids_load_as_before(tmp_path):
    """A converted model saved by `save_pretrained` (no manifest, no t2r record) loads, nan and all."""
    model = t2r.convert(tiny_source("llama"), "gsa", num_slots=4)
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight[0, 0] = float("nan")
    model.save_pretrained(tmp_path / "mine")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "mine")
    assert loaded.model.layers[0].mlp.up_proj.weight[0, 0].isnan()
    assert loading.local_dir("HuggingFaceTB/SmolLM2-135M", {}) is None  # a hub id: not checked here
    assert loading.local_dir(None, {"state_dict": {}}) is None  # weights in memory (t2r.convert)


def test_load_source_hashes_each_file_once(written, monkeypatch):
    hashed = []
    real = manifest.sha256
    monkeypatch.setattr(manifest, "sha256", lambda path, sync=False: hashed.append(path.name) or real(path, sync))
    load_source(str(written))
    assert hashed.count(WEIGHTS) == 1
    hashed.clear()
    AutoModelForCausalLM.from_pretrained(written)  # a load of its own checks again
    assert hashed.count(WEIGHTS) == 1


def test_a_directory_changed_after_load_source_verified_it_is_checked_again(copy):
    assert manifest.verify_model_dir(copy) is True
    (copy / "config.json").write_text((copy / "config.json").read_text() + " ")
    refused(copy, "gsa is damaged: config.json is")


def test_a_check_started_ahead_is_the_loads_check(written, monkeypatch, manifest_checks):
    """`t2r finetune` starts the source's check beside its imports (`verify_ahead`); the load then takes that
    check's outcome instead of hashing again."""
    hashed = []
    real = manifest.sha256
    monkeypatch.setattr(manifest, "sha256", lambda path, sync=False: hashed.append(path.name) or real(path, sync))
    verify_ahead(str(written))
    load_source(str(written))
    assert hashed.count(WEIGHTS) == 1
    assert manifest_checks == ["t2r-verify gsa"]  # the check ran in the thread, not again in the load
    assert manifest._key(written) not in manifest._ahead  # taken once


def test_damage_found_ahead_is_raised_by_the_load(copy):
    data = bytearray((copy / WEIGHTS).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / WEIGHTS).write_bytes(bytes(data))
    verify_ahead(str(copy))
    with pytest.raises(DamagedModelError, match="gsa is damaged: model.safetensors does not match its SHA-256"):
        load_source(str(copy))


def test_a_file_changed_after_the_check_ahead_is_checked_again(copy):
    verify_ahead(str(copy))
    manifest._ahead[manifest._key(copy)].join()  # passed, on the files as they were
    (copy / "config.json").write_text((copy / "config.json").read_text() + " ")
    with pytest.raises(DamagedModelError, match="gsa is damaged: config.json is"):
        manifest.verify_model_dir(copy)


def test_nothing_is_checked_ahead_for_what_is_not_a_local_directory(tmp_path):
    started = set(manifest._ahead)  # other tests' runs that stopped before loading may have left theirs
    for spec in ("HuggingFaceTB/SmolLM2-135M", str(tmp_path / "missing"), "./missing.gguf", str(tmp_path / "x.gguf")):
        verify_ahead(spec)
    assert set(manifest._ahead) == started
