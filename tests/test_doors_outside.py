"""Issue 41 from outside: the cases that still slipped through a door other than the one first fixed, each
reproduced as a user would meet it (the cache's SmolLM2 copy, `from_pretrained` of a t2r directory or adapter,
the stored baseline scores of `t2r eval`, rows of data that are not text, numbers without a sane bound)."""

import hashlib
import json
import re
import shutil
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


# --- from_pretrained of a directory or adapter t2r wrote ----------------------------------------------------------

@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """(converted model directory, adapter directory) as `t2r convert` and `t2r.save_adapter` write them."""
    from peft import LoraConfig, get_peft_model

    import t2r

    tmp = tmp_path_factory.mktemp("written")
    t2r.save_converted(t2r.convert(tiny_source("llama"), "gsa", num_slots=4), word_tokenizer(), tmp / "gsa",
                       source="tiny")
    peft = get_peft_model(t2r.convert(tiny_source("llama"), "gsa", num_slots=4),
                          LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, param in peft.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.02)
    t2r.save_adapter(peft, tmp / "adapter", base=str(tmp / "gsa"))
    return tmp / "gsa", tmp / "adapter"


def edited(directory, tmp_path, change):
    """A copy of `directory` with `change(state)` applied to its weights and its manifest written again (as a user
    who re-signs a directory would): the checksums then pass, the tensors are what is wrong."""
    from safetensors.torch import load_file, save_file

    copy = tmp_path / directory.name
    shutil.copytree(directory, copy)
    state = load_file(copy / "model.safetensors")
    change(state)
    save_file(state, copy / "model.safetensors", metadata={"format": "pt"})
    manifest.write(copy)
    return copy


def refused_in_one_line(directory, match):
    """The refusal, and nothing else said: transformers' multi-line load report is not logged."""
    import logging

    from transformers import AutoModelForCausalLM

    class Kept(logging.Handler):
        records = []

        def emit(self, record):
            self.records.append(record.getMessage())

    logger = logging.getLogger("transformers.modeling_utils")
    logger.addHandler(kept := Kept())
    try:
        with pytest.raises(DamagedModelError, match=match) as err:
            AutoModelForCausalLM.from_pretrained(directory)
    finally:
        logger.removeHandler(kept)
    assert "\n" not in str(err.value)
    assert not [r for r in kept.records if "LOAD REPORT" in r]


DOWN = "model.layers.0.mlp.down_proj.weight"


def test_from_pretrained_refuses_a_missing_tensor_behind_a_resigned_manifest(written, tmp_path):
    """Before: transformers printed a report and left the tensor at random; the logits changed, exit 0."""
    copy = edited(written[0], tmp_path, lambda state: state.pop(DOWN))
    refused_in_one_line(copy, rf"lacks 1 tensor\(s\) of the model \({DOWN}")


def test_a_tensor_of_another_shape_is_one_line_naming_it(written, tmp_path, capsys):
    """A config edited to another num_slots, or a mis-shaped tensor: before, transformers' multi-line report and
    `RuntimeError: ... look at the above report!`, through from_pretrained, load_source and the command line."""
    from t2r.cli import main

    copy = edited(written[0], tmp_path, lambda state: state.update({DOWN: state[DOWN][:, :-1].contiguous()}))
    capsys.readouterr()
    refused_in_one_line(copy, rf"has a wrong shape for 1 tensor\(s\) of the model \({DOWN}")
    config = json.loads((written[0] / "config.json").read_text())
    slots = tmp_path / "slots"
    shutil.copytree(written[0], slots)
    (slots / "config.json").write_text(json.dumps(config).replace('"num_slots": 4', '"num_slots": 8'))
    manifest.write(slots)
    assert main(["generate", "--model", str(slots), "--prompt", "w5", "--max-new-tokens", "1", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if line.strip() and "Loading weights" not in line]  # progress bars
    assert len(said) == 1, err
    said = said[0]
    assert "has a wrong shape for 3 tensor(s) of the model" in said and "slot_gate" in said


def test_an_empty_weights_file_through_from_pretrained_names_the_directory(written, tmp_path):
    """Before: `SafetensorError: Error while deserializing header: header too small`, no file named."""
    copy = tmp_path / "empty"
    shutil.copytree(written[0], copy)
    (copy / "model.safetensors").write_bytes(b"")
    manifest.write(copy)
    refused_in_one_line(copy, r"empty: cannot load the model \(SafetensorError: .*header too small\)")


def test_from_pretrained_of_a_t2r_adapter_checks_its_manifest(written, tmp_path):
    """`AutoModelForCausalLM.from_pretrained(adapter_dir)` (transformers loads the base, then the adapter): before,
    200 flipped bytes in the adapter loaded without a word."""
    from transformers import AutoModelForCausalLM

    assert hasattr(AutoModelForCausalLM.from_pretrained(written[1]), "peft_config")  # intact: loads
    copy = tmp_path / "adapter"
    shutil.copytree(written[1], copy)
    flip_bytes(copy / "adapter_model.safetensors", 200)
    refused_in_one_line(copy, "adapter_model.safetensors does not match its SHA-256")
    model_class = type(AutoModelForCausalLM.from_pretrained(written[0]))
    with pytest.raises(DamagedModelError, match="adapter_model.safetensors does not match its SHA-256"):
        model_class.from_pretrained(copy)  # the class itself given the adapter's directory


# --- t2r eval's stored baseline scores ----------------------------------------------------------------------------

def test_stored_baseline_scores_follow_a_file_rewritten_with_its_size_and_mtime_kept(tmp_path):
    """The baseline's weights replaced in place by others of the same size, the mtime set back (`cp -p`,
    `touch -r`, rsync): before, the fingerprint (remembered by path, size and mtime) was the old one, and `t2r eval`
    reported the old baseline's perplexity (99.99 instead of 107.03) as "same weights, inputs and settings"."""
    import os
    import time

    from safetensors.torch import load_file, save_file

    from t2r.eval.result_cache import ResultCache
    from tests.helpers.models import save_tiny_source

    baseline = save_tiny_source(tmp_path / "baseline")
    weights = baseline / "model.safetensors"
    cache = ResultCache(tmp_path / "cache")
    before = cache.fingerprint(str(baseline), None)
    kept = weights.stat()
    time.sleep(0.05)  # past the clock tick of the first write
    state = load_file(weights)
    save_file({name: t * 1.5 for name, t in state.items()}, weights, metadata={"format": "pt"})
    os.utime(weights, ns=(kept.st_atime_ns, kept.st_mtime_ns))
    assert (weights.stat().st_size, weights.stat().st_mtime_ns) == (kept.st_size, kept.st_mtime_ns)
    assert ResultCache(tmp_path / "cache").fingerprint(str(baseline), None) != before  # a later `t2r eval`
    assert ResultCache(tmp_path / "cache").fingerprint(str(baseline), None) == cache.fingerprint(str(baseline), None)


def recipe_file(tmp_path, data):
    """A 2-step recipe file over a tiny saved source and `data`, its run in `tmp_path / "run"`."""
    from tests.helpers.models import save_tiny_source

    source = save_tiny_source(tmp_path / "source")
    config = tmp_path / "r.yaml"
    config.write_text(f"""
name: tiny
model: {{source: "{source}", dtype: float32}}
convert: {{target: gsa, options: {{num_slots: 8}}}}
data: {{path: "{data}", seq_len: 32, held_out: 4}}
train: {{lr: 3.0e-3, warmup_steps: 0, tokens_per_step: 64, micro_batch_size: 2, max_steps: 2, mixed_precision: "no"}}
checkpoint: {{dir: "{tmp_path / 'run'}"}}
logging: {{plot: false}}
""")
    return config


# --- rows that are not text, deep in a file ------------------------------------------------------------------------

@pytest.mark.parametrize("bad, said", [
    (b'{"text": 12345}', "line 1990: field 'text' holds int, not text"),
    (b'{"text": ["a", "list"]}', "line 1990: field 'text' holds list, not text"),
    (b'{"text": "bad \xff byte"}', r"line 1990: not UTF-8 text \(byte 0xff"),
])
def test_a_row_that_is_not_text_deep_in_a_file_is_refused_before_training(tmp_path, capsys, bad, said):
    """Line 1,990 of 2,000, past the 100 documents read first: before, `--dry-run` passed and the run stopped
    there mid-training (wherever the shuffle put it), after hours of steps on a real corpus."""
    from t2r.cli import main

    rows = [json.dumps({"text": f"the quick brown fox {i} jumps over the lazy dog"}).encode() for i in range(2000)]
    rows[1989] = bad
    data = tmp_path / "deep.jsonl"
    data.write_bytes(b"\n".join(rows) + b"\n")
    config = recipe_file(tmp_path, data)
    capsys.readouterr()
    assert main(["finetune", "--config", str(config), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.search(f"deep.jsonl, {said}", err), err
    assert main(["finetune", "--config", str(config)]) == 2  # the run: before the model loads
    assert re.search(f"deep.jsonl, {said}", capsys.readouterr().err) and not (tmp_path / "run").exists()


def test_a_data_directory_says_which_files_are_read(tmp_path):
    """A directory with an unrelated file added (notes.md) resumes as before, and now says what it read."""
    from t2r.data.check import data_notes
    from t2r.data.config import DataConfig
    from tests.helpers.recipes import write_corpus

    (tmp_path / "data" / "more").mkdir(parents=True)
    write_corpus(tmp_path / "data" / "a.jsonl")
    write_corpus(tmp_path / "data" / "more" / "b.jsonl")
    (tmp_path / "data" / "notes.md").write_text("where the text came from\n")
    assert data_notes(DataConfig(path=str(tmp_path / "data"))) == (
        f"data: 2 files read from {tmp_path / 'data'}: a.jsonl, more/b.jsonl (not read, not data files: notes.md)")
    assert data_notes(DataConfig(path=str(tmp_path / "data" / "*.jsonl"))).endswith(": a.jsonl")
    assert data_notes(DataConfig(path=str(tmp_path / "data" / "a.jsonl"))) is None  # one file: said by the recipe


# --- numbers ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("override", [
    "train.tokens_per_step=1e30",  # before: OverflowError traceback once training started
    "train.trainable=lora lora.r=1e30",  # before: a C++ traceback from torch
    "train.trainable=lora lora.alpha=1e30",  # before: every step skipped, final/ untrained with exit code 0
    "train.seed=1e30",  # before: "Seed must be between 0 and 2**32 - 1", naming no setting
    "train.warmup_steps=1e30",  # before: trained at lr 1.8e-32 without a word
    "data.max_documents=1e30",  # before: "Stop argument for islice() must be None or an integer ..."
    "data.shuffle_buffer=1e30",  # before: "Python int too large to convert to C long"
    "eval.seed=1e30", "eval.bench_repeats=1e30", "eval.windows=[1e30]", "eval.bench_contexts=[1e30]",
])
def test_a_number_past_its_bound_is_refused_with_the_recipe(override):
    from t2r.train.fields import RecipeError
    from tests.helpers.recipes import make_recipe

    *rest, last = override.split()
    with pytest.raises(RecipeError, match=rf"^{re.escape(last.split('=')[0])}: must be <= \d+, got 1e\+30$"):
        make_recipe(*rest, last, check_files=False)


@pytest.mark.parametrize("flag", ["--seed", "--data-documents", "--bench-decode-tokens", "--bench-repeats", "--sinks"])
def test_a_number_past_its_bound_is_refused_as_a_flag(flag, tmp_path, capsys):
    """Before: `--seed 1e30` failed after loading with "Overflow when unpacking long long"; `--data-documents`
    with islice's words; `--bench-decode-tokens` and `--bench-repeats` ran until killed. (A model that does not
    exist: accepted, the flag would fail only there.)"""
    from t2r.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["eval", "--model", str(tmp_path / "absent"), "--out", str(tmp_path / "eval"), flag, "1e30"])
    assert stop.value.code == 2
    assert f"argument {flag}: " in capsys.readouterr().err


def test_a_run_that_ends_on_skipped_steps_writes_no_final_model(tmp_path, capsys):
    """train.lr=1e30 on a 4-step run: every update after the first was non-finite and skipped, fewer than
    max_nonfinite_steps; before, final/ was written and the command exited 0 (the held-out loss of the tiny random
    model stays near its uniform guess, so it cannot tell)."""
    from t2r.cli import main
    from tests.helpers.recipes import write_corpus

    config = recipe_file(tmp_path, write_corpus(tmp_path / "train.jsonl"))
    assert main(["finetune", "--config", str(config), "train.lr=1e30", "train.max_steps=4"]) == 1
    assert ("step 4: the run ended on 3 non-finite steps in a row (updates skipped; 3 in all), so final/ was not "
            "written") in capsys.readouterr().err
    assert not (tmp_path / "run" / "final").exists()


@pytest.mark.parametrize("held_out", [4, 0])
def test_a_spike_at_the_last_step_keeps_the_final_model_its_held_out_loss_vouches_for(tmp_path, source_dir, corpus,
                                                                                      monkeypatch, held_out):
    """One non-finite step, the last: its update is skipped and final/ is written with the weights before it,
    whose held-out loss is measured (a long run is not lost to one spike); with nothing held out, nothing vouches
    for them: no final/, the checkpoints kept."""
    from t2r.train import finetune
    from t2r.train.errors import NonFiniteError
    from tests.helpers.recipes import recipe
    from tests.train.test_nonfinite import inject_nan

    tiny = recipe(tmp_path, source_dir, corpus, **{"train.max_steps": 4, "data.held_out": held_out})
    inject_nan(monkeypatch, {4})
    if held_out:
        finetune(tiny)
        assert json.loads((tmp_path / "run" / "final" / "trained.json").read_text())["skipped_steps"] == 1
    else:
        with pytest.raises(NonFiniteError, match="step 4: the run ended on a non-finite step, and no held-out data"):
            finetune(tiny)
        assert not (tmp_path / "run" / "final").exists() and list((tmp_path / "run").glob("step-*"))


def test_overrides_may_follow_the_flags(tmp_path, capsys):
    """`t2r finetune --config R --dry-run train.max_steps=7` (before: "unrecognized arguments"); an unknown flag
    is still argparse's one-line error."""
    from t2r.cli import main
    from tests.helpers.recipes import write_corpus

    config = recipe_file(tmp_path, write_corpus(tmp_path / "train.jsonl"))
    assert main(["finetune", "--config", str(config), "--dry-run", "train.max_steps=7", "train.lr=2e-3"]) == 0
    out = capsys.readouterr().out
    assert "max_steps: 7" in out and "lr: 0.002" in out
    with pytest.raises(SystemExit) as stop:
        main(["finetune", "--config", str(config), "--dry-run", "--no-such-flag"])
    assert stop.value.code == 2 and "unrecognized arguments: --no-such-flag" in capsys.readouterr().err
