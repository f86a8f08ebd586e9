"""The `t2r` command line on a tiny local model: convert, report, save, generate; clear errors."""

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
from tokenizers import Tokenizer, models, pre_tokenizers

from t2r.cli import main
from tests.models.conftest import tiny_source


def save_tiny_source(path):
    model = tiny_source("llama")
    vocab = {f"w{i}": i for i in range(97)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w3"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="w0", bos_token="w1", eos_token="w2")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model


def test_convert_then_generate(tmp_path, capsys):
    source = save_tiny_source(tmp_path / "src")
    out = tmp_path / "gsa"
    assert main(["convert", "--model", str(tmp_path / "src"), "--to", "gsa", "--num-slots", "4",
                 "--layers", "0-1", "--out", str(out), "--device", "cpu"]) == 0
    report = capsys.readouterr().out
    assert "2/3 layers -> gsa (layers 0-1)" in report
    assert f"source {sum(p.numel() for p in source.parameters()):,}, added {2 * 64 * 2 * 4:,}" in report
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.t2r_mixers == ["gsa", "gsa", "softmax"]
    assert main(["generate", "--model", str(out), "--prompt", "w5 w6 w7", "--prompt", "w9",
                 "--max-new-tokens", "4", "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("w5 w6 w7") and lines[1].startswith("w9")


def test_bad_input_exits_with_a_clear_message(tmp_path, capsys):
    save_tiny_source(tmp_path / "src")
    code = main(["convert", "--model", str(tmp_path / "src"), "--to", "gsa", "--num-slots", "0",
                 "--out", str(tmp_path / "o"), "--device", "cpu"])
    assert code == 2
    assert "num_slots must be a positive integer" in capsys.readouterr().err
    code = main(["convert", "--model", str(tmp_path / "missing.gguf"), "--to", "gla", "--out", str(tmp_path / "o")])
    assert code == 2
    assert "GGUF file not found" in capsys.readouterr().err
    code = main(["generate", "--model", str(tmp_path / "nowhere"), "--prompt", "w5", "--device", "cpu"])
    assert code == 2
    assert "model directory not found" in capsys.readouterr().err
