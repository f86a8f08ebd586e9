"""Stored baseline scores (`t2r.eval.result_cache`): reused on identical input, scored again when a setting or
a weight changes or an entry is unreadable; JSON only; and perplexity and recall written before lm-eval runs."""

import json

import pytest
import torch

from t2r.cli import main
from t2r.eval import perplexity, recall
from t2r.eval.models import load_pair
from t2r.eval.result_cache import FileHashes, ResultCache
from t2r.eval.settings import EvalSettings
from t2r.eval.suite import evaluate
from tests.helpers.models import save_tiny_source

SMALL = dict(suites=["ppl", "passkey"], ppl_length=64, ppl_rows=2, windows=[16], sinks=2, passkey_lengths=[200],
             passkey_depths=[0, 1], passkey_prompts=1, device="cpu", dtype="float32")
"""MQAR needs a tokenizer with words (the character tokenizer has none): its scores go the same way as passkey's
(`recall.scored_accuracy`)."""


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache_pair")
    source = save_tiny_source(root / "source")
    assert main(["convert", "--model", str(source), "--to", "gsa", "--num-slots", "4", "--out", str(root / "gsa"),
                 "--device", "cpu"]) == 0
    return source, root / "gsa"


@pytest.fixture
def scored(monkeypatch):
    """Names of the contenders each run actually scores (perplexity and recall), in order."""
    calls = []
    token_nll, accuracy = perplexity.token_nll, recall.recall_accuracy

    def counting_nll(contender, *args, **kwargs):
        calls.append(("ppl", contender.name))
        return token_nll(contender, *args, **kwargs)

    def counting_accuracy(contender, *args, **kwargs):
        calls.append(("recall", contender.name))
        return accuracy(contender, *args, **kwargs)

    monkeypatch.setattr(perplexity, "token_nll", counting_nll)
    monkeypatch.setattr(recall, "recall_accuracy", counting_accuracy)
    return calls


def run(pair, out, cache_root, source=None, **changes):
    model_dir, source_dir = pair[1], source or pair[0]
    settings = EvalSettings(**{**SMALL, **changes})
    model, tok, baseline, base_tok, spec = load_pair(str(model_dir), str(source_dir), "float32", "cpu")
    return evaluate(model, tok, settings, out, baseline=baseline, baseline_tokenizer=base_tok,
                    model_spec=str(model_dir), baseline_spec=spec, cache_root=cache_root)


def scores(results) -> dict:
    """Every number of perplexity and recall, by contender name."""
    out = {r["name"]: [r["ppl"], [b["ppl"] for b in r["buckets"]]] for r in results["perplexity"]["results"]}
    for name, acc in results["passkey"]["accuracy"].items():
        out[name].append(acc)
    return out


def test_identical_input_reads_the_baseline_back(pair, tmp_path, scored):
    first = run(pair, tmp_path / "a", tmp_path / "cache")
    names = set(scores(first))
    assert names == {"gsa", "source", "window 16+2"} | {n for n in names if n.startswith("mem window")}
    assert {name for _, name in scored} == names and first["cache"]["read"] == 0
    scored.clear()
    second = run(pair, tmp_path / "b", tmp_path / "cache")
    assert {name for _, name in scored} == {"gsa"}  # only the model is scored again
    assert scores(second) == scores(first) and second["cache"]["read"] == first["cache"]["scored"] > 0
    for path in (tmp_path / "cache").rglob("*.json"):  # JSON, nothing else
        json.loads(path.read_text())
    assert "read from" in (tmp_path / "b" / "report.md").read_text()


@pytest.mark.parametrize("change, rescored", [
    ({"sinks": 3}, "window 16+3"),  # the source itself has no sinks: read back
    ({"batch_size": 2}, "source"), ({"ppl_rows": 1}, "source"), ({"dtype": "bfloat16"}, "source")])
def test_a_changed_setting_misses(pair, tmp_path, scored, change, rescored):
    run(pair, tmp_path / "a", tmp_path / "cache", suites=["ppl"])
    scored.clear()
    model_dir, source_dir = pair[1], pair[0]
    settings = EvalSettings(**{**SMALL, "suites": ["ppl"], **change})
    dtype = settings.dtype
    model, tok, baseline, base_tok, spec = load_pair(str(model_dir), str(source_dir), dtype, "cpu")
    evaluate(model, tok, settings, tmp_path / "b", baseline=baseline, baseline_tokenizer=base_tok,
             model_spec=str(model_dir), baseline_spec=spec, cache_root=tmp_path / "cache")
    assert rescored in {name for _, name in scored}
    assert ("source" in {name for _, name in scored}) == (rescored == "source")


def test_a_changed_weight_misses(pair, tmp_path, scored):
    from t2r.sources import load_source

    source = save_tiny_source(tmp_path / "source")  # the same weights as pair's source, another directory
    run(pair, tmp_path / "a", tmp_path / "cache", source=source, suites=["ppl"])
    scored.clear()
    run(pair, tmp_path / "b", tmp_path / "cache", source=source, suites=["ppl"])
    assert {name for _, name in scored} == {"gsa"}
    model, tokenizer = load_source(str(source))
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight[0, 0] += 1e-3
    model.save_pretrained(source)
    scored.clear()
    run(pair, tmp_path / "c", tmp_path / "cache", source=source, suites=["ppl"])
    assert "source" in {name for _, name in scored}


def test_without_files_the_tensors_are_the_fingerprint(pair, tmp_path):
    from t2r.sources import load_source

    cache = ResultCache(tmp_path)
    model, tokenizer = load_source(str(pair[0]))
    before = cache.fingerprint(None, model, tokenizer)  # a hub id: no files to read
    assert cache.fingerprint(None, model, tokenizer) == before
    assert cache.fingerprint(str(pair[0]), model, tokenizer) != before  # from the files instead
    with torch.no_grad():
        model.lm_head.weight[1, 2] += 1e-6
    assert cache.fingerprint(None, model, tokenizer) != before


def test_file_hashes_are_remembered_by_path_size_and_mtime(tmp_path):
    import hashlib
    import os

    file = tmp_path / "w.safetensors"
    file.write_bytes(b"abc")
    hashes = FileHashes(tmp_path / "hashes.json")
    assert hashes.sha256(file) == hashlib.sha256(b"abc").hexdigest()
    memo = json.loads((tmp_path / "hashes.json").read_text())
    memo[str(file.resolve())]["sha256"] = "remembered"
    (tmp_path / "hashes.json").write_text(json.dumps(memo))
    assert FileHashes(tmp_path / "hashes.json").sha256(file) == "remembered"  # not read again
    stat = file.stat()
    os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1000))
    assert FileHashes(tmp_path / "hashes.json").sha256(file) == hashlib.sha256(b"abc").hexdigest()


def test_an_unreadable_entry_is_ignored_with_a_note(pair, tmp_path, scored, capsys):
    import pickle

    first = run(pair, tmp_path / "a", tmp_path / "cache")
    entries = sorted((tmp_path / "cache" / "scores").rglob("*.json"))
    assert len(entries) == first["cache"]["scored"]
    entries[0].write_text("{not json")
    entries[1].write_bytes(pickle.dumps({"value": 1.0}))  # never unpickled: unreadable like any other non-JSON
    entries[2].write_text(json.dumps({"key": {"another": "key"}, "value": 0.5}))  # a stray file under this name
    capsys.readouterr()
    scored.clear()
    second = run(pair, tmp_path / "b", tmp_path / "cache")
    err = capsys.readouterr().err
    assert err.count("ignoring the unreadable cache entry") == 3 and str(entries[0]) in err
    assert len(scored) == 3 + sum(1 for _, name in scored if name == "gsa")
    assert scores(second) == scores(first)
    for path in entries:  # rewritten
        json.loads(path.read_text())


def test_perplexity_and_recall_are_written_before_lm_eval_runs(pair, tmp_path, monkeypatch):
    """A run cut short inside lm-eval keeps report.md and results.json with perplexity and recall."""
    from t2r.eval import harness

    def cut_short(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(harness, "run_harness", cut_short)
    monkeypatch.setattr(EvalSettings, "harness_specs", lambda self: [harness.TaskSpec("piqa", 0, "acc")])
    with pytest.raises(KeyboardInterrupt):
        run(pair, tmp_path / "out", tmp_path / "cache")
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert {"perplexity", "passkey"} <= set(results) and results["unfinished"] == ["lm-eval"]
    assert "**unfinished**: lm-eval" in (tmp_path / "out" / "report.md").read_text()


def test_the_baselines_lm_eval_scores_are_reused_until_a_task_file_changes(pair, tmp_path, monkeypatch):
    from t2r.eval import harness

    task = tmp_path / "tasks" / "mine.jsonl"
    task.parent.mkdir()
    task.write_text('{"query": "w5", "choices": [" w6", " w7"], "gold": 0}\n')
    calls = []

    def fake_harness(model, tokenizer, specs, **kwargs):
        calls.append(model.config.model_type)
        return {"lm_eval_version": "x", "tasks": {s.name: {"metric": "acc", "value": 0.5} for s in specs}}

    monkeypatch.setattr(harness, "run_harness", fake_harness)
    for content in ("same", "same", "changed"):
        if content == "changed":
            task.write_text(task.read_text() + '{"query": "w8", "choices": [" w9", " w10"], "gold": 1}\n')
        run(pair, tmp_path / content, tmp_path / "cache", suites=[], tasks=[str(task)])
    assert calls == ["t2r_llama", "llama", "t2r_llama", "t2r_llama", "llama"]
