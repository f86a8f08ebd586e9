"""`t2r convert` on a tiny local model: it never overwrites, its flags follow the mixer options, and a fresh
conversion says how to finetune it."""

import json
import shlex
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from t2r.cli import main
from t2r.outputs import umask
from tests.helpers.models import save_tiny_source


def test_convert_never_overwrites_its_source_or_writes_into_a_file(tmp_path, capsys):
    save_tiny_source(tmp_path / "src", tokenizer="words")
    before = {p.name: p.read_bytes() for p in (tmp_path / "src").iterdir()}
    args = ["convert", "--model", str(tmp_path / "src"), "--to", "gla", "--device", "cpu", "--out"]
    assert main([*args, str(tmp_path / "src" / ".")]) == 2
    assert "is the source model's directory" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in (tmp_path / "src").iterdir()} == before
    (tmp_path / "file").write_text("x")
    assert main([*args, str(tmp_path / "file")]) == 2
    assert "is a file; give a directory" in capsys.readouterr().err
    assert main([*args, str(tmp_path / "out")]) == 0
    assert main([*args, str(tmp_path / "out")]) == 2
    assert "is not empty (README.md, config.json, generation_config.json, manifest.json, ...); " \
        "pass --overwrite" in capsys.readouterr().err
    assert main([*args, str(tmp_path / "out"), "--overwrite"]) == 0
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "out").config.t2r_mixers == ["gla"] * 3


def test_convert_flags_follow_the_mixer_options(tmp_path, capsys):
    """Every option of every registered mixer is a `t2r convert` flag; the help gives each default per target."""
    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--rope true|false apply the source's rotary embedding to q and k (default: false for gsa, gla, " \
        "retnet, gdn; true for fox)" in text
    assert "(default: 8 for gsa; 16 for gla)" in text and "(gsa; default 64)" in text
    assert "--gate-low-rank-dim GATE_LOW_RANK_DIM GLA: rank of the low-rank forget-gate projection (gla; default " \
        "16)" in text
    assert "--fox-gate-bias FOX_GATE_BIAS FoX: initial forget-gate bias" in text and "(fox; default 8)" in text
    save_tiny_source(tmp_path / "src", tokenizer="words")
    for target, flags, expected in (
            ("gla", ["--gate-low-rank-dim", "4", "--rope", "true"], {"gate_low_rank_dim": 4, "rope": True}),
            ("fox", ["--fox-gate-bias", "2.5", "--output-norm", "true"], {"fox_gate_bias": 2.5, "output_norm": True})):
        out = tmp_path / target
        assert main(["convert", "--model", str(tmp_path / "src"), "--to", target, "--out", str(out),
                     "--device", "cpu", *flags]) == 0
        options = json.loads((out / "config.json").read_text())["t2r_options"][target]
        assert {k: options[k] for k in expected} == expected


def test_a_fresh_conversion_says_so_with_the_command_that_finetunes_it(tmp_path, capsys):
    """convert and generate say once that the model is untrained, with a finetune command that works; a
    finetuned model (final/, with its recipe.yaml) gets no such note."""
    from t2r.data.synthetic import write_jsonl
    from t2r.train import load_recipe

    save_tiny_source(tmp_path / "src")
    out = tmp_path / "gla"
    assert main(["convert", "--model", str(tmp_path / "src"), "--to", "gla", "--out", str(out), "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("note: this model is freshly converted (gla) and untrained") == 1
    assert "its text is nonsense until it is finetuned" in printed
    command = printed.splitlines()[-1].strip()
    assert command == (f"t2r finetune --config recipes/smollm2-gsa-cpu.yaml model.source={out} convert.target=none "
                       "convert.options={} name=gla-finetune")  # its own run directory, not the main job's
    assert json.loads((out / "t2r_conversion.json").read_text())["trained"] is False
    card = (out / "README.md").read_text()  # the model card, and every file with the umask's mode
    assert "base_model" not in card and "| layers | t2r_llama, 3 layers: 3 gla |" in card
    assert "freshly converted" in card
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir() if p.is_file()}["model.safetensors"] == \
        0o666 & ~umask()
    assert main(["generate", "--model", str(out), "--prompt", "Ada", "--max-new-tokens", "2", "--device", "cpu"]) == 0
    assert capsys.readouterr().err.count("freshly converted (gla) and untrained") == 1

    overrides = shlex.split(command)[4:]
    cpu = load_recipe("recipes/smollm2-gsa-cpu.yaml", overrides, check_files=False)  # the shipped recipe takes them
    assert (cpu.model.source, cpu.convert.target, cpu.convert.options) == (str(out), "none", {})
    assert cpu.checkpoint.dir == "runs/gla-finetune"
    data = write_jsonl(tmp_path / "train.jsonl", count=20)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: {source: smollm2, dtype: float32}\nconvert: {target: gsa, options: {num_slots: 4}}\n"
                      f"data: {{path: '{data}', seq_len: 32}}\nlogging: {{plot: false}}\n"
                      "train: {tokens_per_step: 32, max_steps: 2, mixed_precision: no}\n")
    assert main(["finetune", "--config", str(recipe), *overrides, f"checkpoint.dir={tmp_path / 'run'}"]) == 0
    final = tmp_path / "run" / "final"
    assert AutoModelForCausalLM.from_pretrained(final).config.t2r_mixers == ["gla"] * 3
    card = (final / "README.md").read_text()
    assert "2 steps, 64 tokens of" in card and "| held-out loss |" in card
    assert "(resolved in `recipe.yaml` here)" in card
    capsys.readouterr()
    assert main(["generate", "--model", str(final), "--prompt", "Ada", "--max-new-tokens", "2", "--device", "cpu"]) == 0
    assert "freshly converted" not in capsys.readouterr().err

    assert main(["convert", "--model", str(tmp_path / "src"), "--to", "fox", "--out", str(tmp_path / "fox"),
                 "--device", "cpu"]) == 0
    assert "freshly converted (fox) and untrained: its forget gates start open, so it writes like the source" in \
        capsys.readouterr().out  # FoXOptions.starts_as_source
    assert main(["convert", "--model", str(tmp_path / "src"), "--to", "fox", "--rope", "false", "--out",
                 str(tmp_path / "fox-norope"), "--device", "cpu"]) == 0
    assert "its text is nonsense until it is finetuned" in capsys.readouterr().out  # no RoPE: not the source


def test_overwrite_replaces_only_what_t2r_wrote(tmp_path, capsys):
    """Before, --overwrite deleted everything in --out, a user's thesis.txt and photos/ included."""
    save_tiny_source(tmp_path / "src", tokenizer="words")
    args = ["convert", "--model", str(tmp_path / "src"), "--to", "gla", "--device", "cpu", "--out",
            str(tmp_path / "out"), "--overwrite"]
    (tmp_path / "out" / "photos").mkdir(parents=True)
    (tmp_path / "out" / "photos" / "cat.jpg").write_bytes(b"jpg")
    (tmp_path / "out" / "thesis.txt").write_text("years of work")
    assert main(args) == 2
    assert "holds files t2r did not write (photos/, thesis.txt): --overwrite replaces only a model t2r wrote" in \
        capsys.readouterr().err
    assert (tmp_path / "out" / "thesis.txt").read_text() == "years of work"
    (tmp_path / "out" / "thesis.txt").unlink()
    shutil.rmtree(tmp_path / "out" / "photos")
    assert main(args) == 0  # an empty directory
    assert main(args) == 0  # a model t2r wrote: replaced
    (tmp_path / "out" / "notes.md").write_text("mine")  # added later: not t2r's
    assert main(args) == 2 and "(notes.md)" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "src"]  # no half copy left beside it


def test_the_library_saves_what_the_command_line_saves(tmp_path):
    """`t2r.save_converted` after `t2r.convert` writes the directory `t2r convert` writes: the same files
    (weights, config, tokenizer, conversion record, model card, manifest), the same weights and config; only
    the command each names differs. Both load, checked against their manifest."""
    from safetensors.torch import load_file

    import t2r
    from t2r import manifest
    from t2r.sources import load_source

    save_tiny_source(tmp_path / "src")
    cli = tmp_path / "cli"
    torch.manual_seed(0)  # the new gates' random start, the same for both
    assert main(["convert", "--model", str(tmp_path / "src"), "--to", "gsa", "--num-slots", "4", "--out", str(cli),
                 "--device", "cpu"]) == 0
    source, tokenizer = load_source(str(tmp_path / "src"))
    torch.manual_seed(0)
    model = t2r.convert(source, "gsa", num_slots=4, source=str(tmp_path / "src"))
    python = t2r.save_converted(model, tokenizer, tmp_path / "python", source=str(tmp_path / "src"), target="gsa")
    assert sorted(p.name for p in python.iterdir()) == sorted(p.name for p in cli.iterdir())
    assert json.loads((python / "config.json").read_text()) == json.loads((cli / "config.json").read_text())
    ours, theirs = load_file(python / "model.safetensors"), load_file(cli / "model.safetensors")
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    records = [json.loads((d / "t2r_conversion.json").read_text()) for d in (python, cli)]
    assert [{k: v for k, v in r.items() if k not in ("converted_by", "command")} for r in records] == \
        [{"source": str(tmp_path / "src"), "target": "gsa", "trained": False}] * 2
    assert "freshly converted" in (python / "README.md").read_text()
    for directory in (python, cli):
        assert manifest.verify_model_dir(directory)
        assert AutoModelForCausalLM.from_pretrained(directory).config.t2r_mixers == ["gsa"] * 3
        assert not (directory.parent / f".tmp-{directory.name}").exists()
