"""Issue 41 from outside: the cases that still slipped through a door other than the one first fixed, each
reproduced as a user would meet it (the cache's SmolLM2 copy, `from_pretrained` of a t2r directory or adapter,
the stored baseline scores of `t2r eval`, rows of data that are not text, numbers without a sane bound)."""

import hashlib
import warnings

import pytest
import torch

from t2r import manifest, sources
from t2r.manifest import DamagedModelError
from tests.helpers.data import word_tokenizer
from tests.helpers.models import tiny_source
from tests.test_model_check import flip_bytes

# --- the cache's dense SmolLM2 copy ------------------------------------------------------------------------------

@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A t2r cache holding a stand-in GGUF (its checksum the expected one) whose "dequantizing" gives a tiny Llama,
    and the dense copy built from it: `smollm2` offline in a second."""
    monkeypatch.setenv("T2R_CACHE", str(tmp_path))
    gguf = tmp_path / sources.SMOLLM2_GGUF
    gguf.write_bytes(b"stand-in GGUF")
    monkeypatch.setattr(sources, "SMOLLM2_GGUF_SHA256", hashlib.sha256(gguf.read_bytes()).hexdigest())
    load = sources.load_source

    def dequantized(spec, *args, **kwargs):
        if spec == str(gguf):
            return tiny_source("llama"), word_tokenizer()
        return load(spec, *args, **kwargs)

    monkeypatch.setattr(sources, "load_source", dequantized)
    dense = sources.smollm2_dense()
    assert (dense / manifest.MANIFEST).is_file()
    return dense


def test_a_dense_copy_missing_its_config_is_built_again(cache):
    """Before: every later `--model smollm2` failed with `Directory not empty: ....part -> ...` and no fix."""
    (cache / "config.json").unlink()
    with pytest.warns(UserWarning, match="lacked config.json: built again from"):
        model, _ = load(sources.SMOLLM2)
    assert (cache / "config.json").is_file() and not cache.with_name(cache.name + ".part").exists()
    assert model.config.vocab_size == tiny_source("llama").config.vocab_size


def test_a_dense_copy_without_its_manifest_is_built_again_not_loaded_unchecked(cache):
    """Before: deleting manifest.json turned the check off, and 1,000 flipped bytes loaded as the model."""
    flip_bytes(cache / "model.safetensors")
    (cache / manifest.MANIFEST).unlink()
    with pytest.warns(UserWarning, match="lacked manifest.json"):
        model, _ = load(sources.SMOLLM2)
    expected = tiny_source("llama").state_dict()
    assert all(torch.equal(t, expected[name]) for name, t in model.state_dict().items())


def test_a_damaged_dense_copy_names_t2r_cache_clear(cache, capsys):
    """Before: the message suggested `t2r convert --overwrite`, which does not touch the cache."""
    from t2r.cli import main

    flip_bytes(cache / "model.safetensors")
    with pytest.raises(DamagedModelError, match=r"model.safetensors does not match its SHA-256.*t2r cache --clear") \
            as err:
        load(sources.SMOLLM2)
    assert "t2r convert" not in str(err.value)
    capsys.readouterr()
    assert main(["generate", "--model", "smollm2", "--prompt", "w5", "--max-new-tokens", "1", "--device", "cpu"]) == 2
    message = capsys.readouterr().err
    assert message.count("\n") == 1 and "t2r cache --clear" in message


def load(spec):
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        return sources.load_source(spec)
