"""`t2r eval` and `t2r bench` end to end on a tiny converted model with a character tokenizer."""

import json

import pytest

from t2r import manifest
from t2r.cli import main
from tests.helpers.models import save_tiny_source


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_eval")
    source = save_tiny_source(root / "source")
    assert main(["convert", "--model", str(source), "--to", "gsa", "--num-slots", "8", "--out", str(root / "gsa"),
                 "--device", "cpu"]) == 0
    return source, root / "gsa"


def test_eval_compares_with_the_recorded_source(converted, tmp_path, capsys, manifest_checks):
    source, model = converted
    out = tmp_path / "report"
    assert main(["eval", "--model", str(model), "--out", str(out), "--device", "cpu", "--suite", "ppl,passkey,bench",
                 "--ppl-length", "128", "--ppl-rows", "2", "--windows", "16", "--passkey-lengths", "200",
                 "--passkey-depths", "0,1", "--contexts", "32,64", "--limit", "1"]) == 0
    printed = capsys.readouterr().out
    # hashed beside the imports, once, and taken by the load (other tests' runs that stopped before loading may
    # have left checks of their own directories in this worker)
    assert manifest_checks.count("t2r-verify gsa") == 1 and manifest._key(model) not in manifest._ahead
    results = json.loads((out / "results.json").read_text())
    assert results["models"]["baseline"]["spec"] == str(source)  # the default baseline: config.t2r_source
    names = [row["name"] for row in results["perplexity"]["results"]]
    assert names[:2] == ["gsa", "source"] and "window 16+4" in names
    assert results["perplexity"]["rows"] == 1 and results["perplexity"]["length"] == 128
    assert set(results["passkey"]["accuracy"]) == set(names)
    bench = {(r["model"], r["context"]): r for r in results["bench"]}
    assert bench["gsa", 32]["cache_bytes"] == bench["gsa", 64]["cache_bytes"]  # a fixed state
    assert bench["source", 64]["cache_bytes"] > bench["source", 32]["cache_bytes"]  # a growing KV cache
    for plot in ("perplexity_by_position.png", "passkey.png", "memory_vs_context.png", "decode_vs_context.png"):
        assert (out / plot).stat().st_size > 1000
    assert "## Perplexity by position" in printed and (out / "report.md").read_text() in printed
    # progress off a terminal: a line per suite and per model or cell; the quick look's cuts, in the report too
    assert "ppl: 1 row of 128 tokens; 4 models" in printed and "  ppl gsa: " in printed
    assert "passkey: done in" in printed
    assert "ppl_rows 2 -> 1" in printed and "ppl_rows 2 -> 1" in (out / "report.md").read_text()
    card = (model / "README.md").read_text()  # the model's card shows this evaluation, read from results.json
    assert f"model card {model / 'README.md'} now shows this evaluation" in printed
    assert "model-index:" in card and "## Evaluation" in card and "**Quick look**" in card
    assert "- perplexity: " in card and "- late positions: " in card and "- passkey: mean accuracy" in card


def test_eval_refuses_bad_input_before_loading(converted, tmp_path, capsys):
    _, model = converted
    assert main(["eval", "--model", str(model), "--out", str(tmp_path), "--tasks", "hellaswg"]) == 2
    assert "did you mean 'hellaswag'" in capsys.readouterr().err
    assert main(["eval", "--model", str(model), "--out", str(tmp_path), "--data", "missing/heldout.jsonl"]) == 2
    assert "missing/heldout.jsonl" in capsys.readouterr().err
    assert main(["eval", "--model", str(model), "--out", str(tmp_path), "--device", "cpu", "--suite", "ppl",
                 "--ppl-length", "4096"]) == 2  # the tiny models hold 256 positions
    assert "max_position_embeddings" in capsys.readouterr().err


def test_eval_refuses_a_baseline_with_another_tokenizer(converted, tmp_path, capsys):
    from tests.helpers.models import save_tiny_source

    _, model = converted
    save_tiny_source(tmp_path / "other", tokenizer="words")  # a word-level tokenizer
    assert main(["eval", "--model", str(model), "--baseline", str(tmp_path / "other"), "--out", str(tmp_path / "r"),
                 "--device", "cpu", "--suite", "ppl", "--ppl-length", "64"]) == 2
    assert "another tokenizer" in capsys.readouterr().err


def test_bench_prints_both_models(converted, tmp_path, capsys):
    _, model = converted
    assert main(["bench", "--model", str(model), "--contexts", "16,32", "--decode-tokens", "2", "--device", "cpu",
                 "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "gsa prefill tok/s" in printed and "source prefill tok/s" in printed
    rows = json.loads((tmp_path / "bench.json").read_text())
    assert {(r["model"], r["context"]) for r in rows} == {(m, c) for m in ("gsa", "source") for c in (16, 32)}


def test_bench_train_prints_both_models(converted, tmp_path, capsys):
    _, model = converted
    assert main(["bench", "--model", str(model), "--train", "--contexts", "16,32", "--tokens-per-step", "64",
                 "--steps", "1", "--device", "cpu", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "64 tokens per step, training" in printed and "| x source |" in printed
    rows = json.loads((tmp_path / "bench.json").read_text())
    assert [(r["model"], r["context"], r["batch"], r["status"]) for r in rows] == [
        ("gsa", 16, 4, "ok"), ("gsa", 32, 2, "ok"), ("source", 16, 4, "ok"), ("source", 32, 2, "ok")]
    assert all(r["tokens_per_s"] > 0 and r["step_ms"] > 0 for r in rows)
    assert (tmp_path / "train_vs_context.png").stat().st_size > 0


def test_bench_train_refuses_a_list_of_step_sizes(converted, capsys):
    _, model = converted
    with pytest.raises(SystemExit):
        main(["bench", "--model", str(model), "--train", "--tokens-per-step", "16,32"])
    assert "give one size" in capsys.readouterr().err


@pytest.mark.parametrize("flags, named", [
    (["--train", "--decode", "static", "--batch-sizes", "4"], "--batch-sizes, --decode do not apply to --train"),
    (["--steps", "2"], "--steps does not apply without --train (prefill and decode); drop it or add --train"),
    (["--train", "--steps", "0"], "--steps 0: give at least 1 timed step")])
def test_bench_refuses_flags_of_the_other_mode_before_loading(flags, named, capsys):
    assert main(["bench", "--model", "missing/model-dir-that-is-not-read", *flags]) == 2
    assert named in capsys.readouterr().err


def test_every_setting_is_a_flag_with_its_help_and_default(capsys):
    """`t2r eval` has one flag per `EvalSettings` field, named after it, with the field's help and default;
    `t2r bench` has the bench settings without their prefix. A recipe's eval: names are the same fields."""
    from dataclasses import fields

    from t2r.cli.eval_flags import default_text
    from t2r.eval.settings import EvalSettings

    for command, argv in (("eval", ["eval", "--help"]), ("bench", ["bench", "--help"])):
        with pytest.raises(SystemExit):
            main(argv)
        text = "".join(capsys.readouterr().out.split())  # argparse wraps lines, at hyphens too
        for f in fields(EvalSettings):
            if command == "bench" and f.metadata["group"] != "bench" and f.name not in ("baseline", "device", "dtype",
                                                                                         "seed"):
                continue
            name = f.name.removeprefix("bench_") if command == "bench" else f.name
            help_text = "".join(f"{f.metadata['help']} (default: {default_text(f)})".split())
            assert f"--{name.replace('_', '-')}" in text and help_text in text, (command, f.name)
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for shown in ("--data-documents N how many held-out documents to read from --data (default: 256)",
                  "--mqar-prompts N MQAR: prompts per cell (default: 8)",
                  "--passkey-prompts N passkey: prompts per (length, depth) cell (default: 2)",
                  "--lm-eval-max-length N lm-eval max_length (the same for both models) (default: 2048)"):
        assert shown in text
    for hidden in ("--suite ", "--contexts", "--max-length", "--batch-sizes"):  # old spellings: accepted, not shown
        assert hidden not in text


def test_flags_left_out_keep_the_settings_defaults_and_old_spellings_still_work():
    from t2r.cli import build_parser
    from t2r.cli.evaluate import bench_settings, eval_settings
    from t2r.eval.settings import EvalSettings

    parser = build_parser()
    assert eval_settings(parser.parse_args(["eval", "--out", "o"])) == EvalSettings()
    given = eval_settings(parser.parse_args([
        "eval", "--out", "o", "--data-documents", "9", "--mqar-prompts", "3", "--passkey-prompts", "5",
        "--ppl-length", "1K", "--pack", "--windows", "32,1K", "--passkey-depths", "0,0.5", "--bench-decode", "static"]))
    assert given == EvalSettings(data_documents=9, mqar_prompts=3, passkey_prompts=5, ppl_length=1024, pack=True,
                                 windows=[32, 1024], passkey_depths=[0.0, 0.5], bench_decode="static")
    assert eval_settings(parser.parse_args(["eval", "--out", "o", "--pack", "false"])).pack is False
    old = eval_settings(parser.parse_args(["eval", "--out", "o", "--suite", "ppl", "--contexts", "1K,2K",
                                           "--batch-sizes", "1,4", "--max-length", "512"]))
    new = eval_settings(parser.parse_args(["eval", "--out", "o", "--suites", "ppl", "--bench-contexts", "1K,2K",
                                           "--bench-batch-sizes", "1,4", "--lm-eval-max-length", "512"]))
    assert old == new == EvalSettings(suites=["ppl"], bench_contexts=[1024, 2048], bench_batch_sizes=[1, 4],
                                      lm_eval_max_length=512)
    assert eval_settings(parser.parse_args(["eval", "--out", "o", "--tasks", "piqa"])).suites == []
    bench = bench_settings(parser.parse_args(["bench", "--contexts", "2K", "--repeats", "1", "--decode", "static"]))
    assert bench == EvalSettings(bench_contexts=[2048], bench_repeats=1, bench_decode="static")
