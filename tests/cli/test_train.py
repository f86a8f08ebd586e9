"""`t2r finetune` and `t2r run` on tiny recipes: overrides, dry runs, data errors before anything loads, the
report after training."""

import json
from pathlib import Path

from t2r.cli import main
from tests.helpers.models import save_tiny_source


def test_finetune_from_a_recipe_with_overrides(tmp_path, capsys):
    """`t2r finetune --config recipe.yaml section.field=value ...` trains, checkpoints and saves the
    model, which `t2r generate` then loads; a bad recipe stops before anything loads."""
    from t2r.data.synthetic import write_jsonl

    source = save_tiny_source(tmp_path / "src")
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
    out = capsys.readouterr().out
    assert "step=3 tokens=384" in out
    assert (run / "final" / "model.safetensors").is_file() and (run / "step-00000003").is_dir()
    if Path("/proc/self/stat").exists():  # the command's start-up line counts the process from its start
        assert "start-up: " in out and "(imports " in out and '"imports_s"' in (run / "startup.json").read_text()
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
    assert "# data parallel on" not in out  # 16 micro-batches a process a step even on 8
    # the memory plan from the built-in config (no hub access), as from MistralConfig() saved to a folder
    assert "built-in copy of mistralai/Mistral-7B-v0.1's config" in out and "| DDP | 1 | 27.2 | 27.2 | 54.5 |" in out


def test_every_shipped_recipe_from_the_hub_has_a_built_in_config():
    import yaml

    from t2r.models.known_configs import KNOWN_CONFIGS, known_config

    sources = {yaml.safe_load(p.read_text())["model"]["source"] for p in Path("recipes").glob("*.yaml")}
    assert sources - {"smollm2"} <= set(KNOWN_CONFIGS), sources
    llama = known_config("meta-llama/Meta-Llama-3-8B")
    assert (llama.model_type, llama.vocab_size, llama.num_key_value_heads) == ("llama", 128256, 8)


def test_run_finetunes_then_reports_against_the_source(tmp_path, capsys):
    from t2r.data.synthetic import write_jsonl

    source = save_tiny_source(tmp_path / "src")
    data = write_jsonl(tmp_path / "train.jsonl", count=60)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model: {{source: '{source}', dtype: float32}}\n"
                      "convert: {target: gsa, options: {num_slots: 8}}\n"
                      f"data: {{path: '{data}', seq_len: 64, held_out: 8}}\n"
                      "train: {tokens_per_step: 128, micro_batch_size: 2, max_steps: 12, lr: 3.0e-3,"
                      " mixed_precision: 'no'}\n"
                      f"checkpoint: {{dir: '{tmp_path / 'run'}'}}\nlogging: {{plot: false}}\n"
                      "eval: {suites: [ppl], data: held-out, pack: true, ppl_length: 128, ppl_rows: 4,"
                      " windows: [16]}\n")
    assert main(["run", "--config", str(recipe)]) == 0
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line.split("|") for line in out.splitlines() if line.startswith("| ")}
    tuned, original = float(rows["gsa"][-2]), float(rows["source"][-2])  # the "all" column
    assert tuned < original  # a random tiny source; 12 steps on the generated text beat it
    assert "window 16+4" in rows
    results = json.loads((tmp_path / "run" / "eval" / "results.json").read_text())
    assert results["perplexity"]["rows"] == 4 and results["models"]["baseline"]["spec"] == str(source)
    card = (tmp_path / "run" / "final" / "README.md").read_text()  # final/'s card: the evaluation, its numbers
    ppl = next(r for r in results["perplexity"]["results"] if r["name"] == "gsa")["ppl"]
    assert f"value: {ppl!r}\n" in card and "[report](../eval/report.md)" in card
    assert "### Window frontier" in card and "- frontier, ppl " in card

    recipe.write_text(recipe.read_text().replace("held_out: 8", "held_out: 0"))
    assert main(["run", "--config", str(recipe)]) == 2
    assert "data.held_out" in capsys.readouterr().err


def test_finetune_data_errors_come_before_anything_loads_and_without_traceback(tmp_path, capsys):
    source = save_tiny_source(tmp_path / "src")
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
    data.write_text('{"text": "one document that is long enough"}\n' * 5 + '{"title": "no text"}\n')
    assert main(["finetune", "--config", str(recipe), "--dry-run", "data.held_out=0"]) == 2
    assert (f"error: data: 1 of 6 rows (16.67%) have no text in 'text' (missing, null or blank; the first: {data}, "
            "line 6), more than data.max_skipped=0.01") in capsys.readouterr().err
    assert main(["finetune", "--config", str(recipe), "--dry-run", "data.held_out=0", "data.max_skipped=0.2"]) == 0
    assert f"data: 1 of 6 rows (16.67%) have no text in 'text' (missing, null or blank; the first: {data}, line 6): " \
           "skipped" in capsys.readouterr().out
    assert main(["finetune", "--config", str(recipe), "--dry-run", "data.max_skipped=2"]) == 2
    assert "data.max_skipped: must be <= 1, got 2" in capsys.readouterr().err
    assert main(["finetune", "--config", str(recipe), "data.held_out=0", "data.max_skipped=0.2"]) == 0  # said in runs
    assert "data: 1 of 6 rows (16.67%) have no text" in capsys.readouterr().out


def test_run_dry_run_says_what_it_would_train_and_evaluate(tmp_path, capsys, monkeypatch):
    """The 7B recipe's plan and eval lengths come from t2r's built-in copy of Mistral's config: no hub lookup (one
    retried the hub for 24 s on an offline machine)."""
    from t2r import sources
    from t2r.data.synthetic import write_jsonl

    real_load_config = sources.load_config

    def no_hub(spec):
        assert spec != "mistralai/Mistral-7B-v0.1", "a built-in config was looked up on the hub"
        return real_load_config(spec)

    monkeypatch.setattr(sources, "load_config", no_hub)
    assert main(["run", "--config", "recipes/mistral-7b-gsa-20b.yaml", "--dry-run", "train.mixed_precision=no",
                 "model.dtype=bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "# plan: 9,536 steps of 2,097,152 tokens" in out
    assert "# eval: then runs/mistral-7b-gsa-20b/final against mistralai/Mistral-7B-v0.1 (suites: ppl;" in out
    assert "report in runs/mistral-7b-gsa-20b/eval/" in out
    data = write_jsonl(tmp_path / "train.jsonl", count=40)
    assert main(["run", "--config", "recipes/smollm2-gsa-cpu.yaml", "--dry-run", "eval.limit=2",
                 f"data.path={data}"]) == 0
    assert "2 rows of 512 tokens; a quick look: ppl_rows 4 -> 2; ppl_length 1024 -> 512;" in capsys.readouterr().out


def _tiny_run(tmp_path, eval_section: str, tokenizer: str = "chars", convert: str = "{target: gsa}",
              held_out: int = 3):
    """A 2-step run recipe on a tiny saved source (max_position_embeddings 256) with `eval_section` and `convert`
    (YAML flow mappings); (its path, the source, the data file)."""
    from t2r.data.synthetic import write_jsonl

    source = save_tiny_source(tmp_path / "src", tokenizer=tokenizer)
    data = write_jsonl(tmp_path / "train.jsonl", count=20)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model: {{source: '{source}', dtype: float32}}\nconvert: {convert}\n"
                      f"data: {{path: '{data}', seq_len: 64, held_out: {held_out}}}\n"
                      "train: {tokens_per_step: 128, max_steps: 2, mixed_precision: 'no'}\n"
                      f"checkpoint: {{dir: '{tmp_path / 'run'}'}}\neval: {eval_section}\n")
    return recipe, source, data


def _refused_before_training(tmp_path, capsys, recipe, error: str) -> None:
    """`t2r run` of `recipe`, with --dry-run and without, ends with exit 2 and exactly `error`, training nothing."""
    capsys.readouterr()  # saving the tiny source
    for extra in (["--dry-run"], []):
        assert main(["run", "--config", str(recipe), *extra]) == 2
        err = capsys.readouterr().err
        assert err == error, err
        assert not (tmp_path / "run").exists()  # nothing trained


def test_run_checks_its_eval_lengths_against_the_model_before_training(tmp_path, capsys):
    """Before: --dry-run passed, training completed, then `ppl asks for 2048 tokens but source supports 256`."""
    recipe, source, _ = _tiny_run(tmp_path, "{suites: [ppl], ppl_length: 2048}",
                                  convert="{target: gsa, layers: '0-1'}", held_out=2)
    for extra in (["--dry-run"], []):
        assert main(["run", "--config", str(recipe), *extra]) == 2
        err = capsys.readouterr().err
        assert f"eval: ppl asks for 2048 tokens but {tmp_path / 'run'}/final supports 256" in err, err
        assert not (tmp_path / "run").exists()  # nothing trained
    recipe.write_text(recipe.read_text().replace("layers: '0-1'", "layers: null"))  # all GSA: no limit, but the
    assert main(["run", "--config", str(recipe), "--dry-run"]) == 2  # source it is compared with has one
    assert f"eval: ppl asks for 2048 tokens but {source} supports 256" in capsys.readouterr().err
    assert main(["run", "--config", str(recipe), "--dry-run", "eval.baseline=none"]) == 0


def test_run_checks_its_perplexity_rows_against_the_held_out_text_before_training(tmp_path, capsys):
    """Before: ppl_rows larger than the held-out text trained, then scored fewer rows without a word (or, with
    generated documents and ppl_rows: 1e30, wrote documents until killed)."""
    recipe, source, data = _tiny_run(tmp_path, "{suites: [ppl], data: held-out, ppl_length: 16, ppl_rows: 1000000, "
                                               "baseline: none}", tokenizer="words")
    _refused_before_training(tmp_path, capsys, recipe, (
        "t2r run: error: eval.ppl_rows: 1,000,000 rows of 16 tokens asked, but train gives 3 (3 documents read, of "
        "at least 16 tokens each); lower ppl_rows or ppl_length, or read more documents (data.held_out) or join "
        "them (pack) (checked before training; the recipe's eval section sets it)\n"))
    assert main(["run", "--config", str(recipe), "--dry-run", "eval.data=null"]) == 2  # generated documents
    assert "but the generated held-out text is at most data_documents=256 documents" in capsys.readouterr().err
    assert main(["run", "--config", str(recipe), "--dry-run", "eval.ppl_rows=3"]) == 0
    assert main(["eval", "--model", str(source), "--baseline", "none", "--suites", "ppl", "--data", str(data),
                 "--data-documents", "5", "--ppl-length", "16", "--ppl-rows", "6", "--device", "cpu",
                 "--out", str(tmp_path / "eval")]) == 2
    assert "eval.ppl_rows: 6 rows of 16 tokens asked, but train gives 5 (5 documents read" in capsys.readouterr().err


def test_a_cut_off_compressed_data_file_is_one_line_in_a_dry_run(tmp_path, capsys):
    import gzip

    source = save_tiny_source(tmp_path / "src")
    whole = gzip.compress(b'{"text": "one document that is long enough"}\n' * 50)
    data = tmp_path / "train.jsonl.gz"
    data.write_bytes(whole[:len(whole) // 2])
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model: {{source: '{source}', dtype: float32}}\nconvert: {{target: gla}}\n"
                      f"data: {{path: '{data}', seq_len: 8, held_out: 1}}\n"
                      "train: {tokens_per_step: 8, max_steps: 2, mixed_precision: 'no'}\n"
                      f"checkpoint: {{dir: '{tmp_path / 'run'}'}}\n")
    capsys.readouterr()  # saving the tiny source
    assert main(["finetune", "--config", str(recipe), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"t2r finetune: error: {data}: the compressed file is cut off or damaged" in err


def test_run_checks_its_recall_prompts_against_the_vocabulary_before_training(tmp_path, capsys):
    """Before: MQAR on a tokenizer without enough single-token words trained, then failed in the evaluation."""
    # one token per character: no single-token word at all
    recipe, source, _ = _tiny_run(tmp_path, "{suites: [mqar], mqar_pairs: [8], baseline: none}")
    _refused_before_training(tmp_path, capsys, recipe, (
        "t2r run: error: eval.mqar_pairs: 8 pairs asked, but the tokenizer has only 0 single-token words; recall "
        "needs 64; lower mqar_pairs (a quarter of the words, at most) or leave mqar out of the suites (checked "
        "before training; the recipe's eval section sets it)\n"))
    assert main(["eval", "--model", str(source), "--baseline", "none", "--suites", "mqar", "--mqar-pairs", "8",
                 "--device", "cpu", "--out", str(tmp_path / "eval")]) == 2
    assert "eval.mqar_pairs: 8 pairs asked, but the tokenizer has only 0 single-token words" in capsys.readouterr().err


def test_the_dry_run_says_where_data_parallel_processes_run_one_micro_batch_a_step(capsys):
    """The frontier recipe's 65,536 tokens a step are one micro-batch of 16 x 2048 a process on two: DDP's
    scaling is lowest there (two H200s: 1.78x one card, 1.90x at four micro-batches a process)."""
    assert main(["finetune", "--config", "recipes/frontier/smollm2-gdn-hybrid.yaml", "--dry-run",
                 "data.path=org/dataset"]) == 0
    out = capsys.readouterr().out
    assert "2x on 1 process, 1x on 2" in out
    assert "# data parallel on 2 processes: each runs one micro-batch a step" in out
    assert main(["finetune", "--config", "recipes/frontier/smollm2-gdn-hybrid.yaml", "--dry-run",
                 "data.path=org/dataset", "train.tokens_per_step=262144"]) == 0
    out = capsys.readouterr().out
    assert "4x on 2, 2x on 4, 1x on 8" in out and "# data parallel on 8 processes" in out
