"""`t2r generate` on a tiny model converted by `t2r convert`."""

from transformers import AutoModelForCausalLM

from t2r.cli import main
from tests.helpers.models import save_tiny_source, tiny_source


def test_convert_then_generate(tmp_path, capsys, manifest_checks):
    from t2r import manifest

    save_tiny_source(tmp_path / "src", tokenizer="words")
    source = tiny_source("llama")  # the saved model
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
    assert manifest_checks[-1] == "t2r-verify gsa"  # the conversion's checksums hashed beside the command's imports
    assert manifest._key(out) not in manifest._ahead  # taken by the load


def test_a_model_saved_without_its_tokenizer_is_one_line(tmp_path, capsys):
    """`model.save_pretrained(dir)` from Python writes no tokenizer: `t2r generate` says so and how to save one
    (transformers' own error took five lines)."""
    import t2r

    t2r.convert(tiny_source("llama"), "gla").save_pretrained(tmp_path / "gla")
    capsys.readouterr()  # the save's own progress bar
    assert main(["generate", "--model", str(tmp_path / "gla"), "--prompt", "w5", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds a model but no tokenizer" in err[0] and "t2r.save_converted" in err[0]
