"""lm-eval glue: preset names exist in the installed lm-eval, names resolve (or fail with a suggestion), and a
local multiple-choice task scored through lm-eval agrees with t2r's own reference scorer, request by request."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

import t2r  # noqa: E402
from t2r.eval.harness import (  # noqa: E402
    LOCAL_DATA_ENV,
    PRESETS,
    TaskSpec,
    check_tasks,
    known_tasks,
    local_task,
    resolve_tasks,
    run_harness,
)
from t2r.eval.multiple_choice import encode_pair, loglikelihoods, score_multiple_choice  # noqa: E402
from tests.helpers.data import char_tokenizer, write_jsonl  # noqa: E402
from tests.helpers.models import tiny_source  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

# choices of very different lengths, so that acc (sum of log-probs) and acc_norm (per character) disagree
ITEMS = [
    {"query": "The river was", "choices": [" quiet", " loud and full of boats that sailed all day"], "gold": 0},
    {"query": "Numbers like 42 and", "choices": [" 7", " seven hundred", " many"], "gold": 0},
    {"query": "She opened the", "choices": [" window and listened to the rain", " door", " box", " tin"],
     "gold": 0},
    {"query": "Birds flew", "choices": [" south", " north for the whole of the long winter"], "gold": 1},
    {"query": "Tea or", "choices": [" coffee?", " juice, milk or water?"], "gold": 0},
    {"query": "The cat slept on the warm", "choices": [" stones", " rug by the fire"], "gold": 0},
    {"query": "Stars came out over the", "choices": [" hills", " sea", " tall dark mountains far away"], "gold": 2},
    {"query": "It", "choices": [" rained.", " snowed all night long."], "gold": 0},
    {"query": "The bridge was closed for", "choices": [" repairs.", " a while, then opened again."], "gold": 1},
    {"query": "Why", "choices": [" not?", " would anyone do that?"], "gold": 0},
    {"query": "Every morning the baker lit the", "choices": [" oven", " lamp", " candles on the table"], "gold": 0},
    {"query": "Ships left the harbour", "choices": [" one by one", " slowly"], "gold": 1},
]


@pytest.fixture(scope="module")
def lm_eval_index():
    return known_tasks()  # indexing lm-eval's built-in tasks takes ~10 s, once per process


@pytest.fixture(scope="module")
def tiny():
    tokenizer = char_tokenizer()
    return tiny_source("llama", vocab_size=len(tokenizer)), tokenizer


def hflm_loglikelihoods(model, tokenizer, pairs):
    """lm-eval's own log-likelihoods for (context, continuation) pairs, batched its way."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=3, max_length=512, backend="causal")
    requests = [Instance(request_type="loglikelihood", doc={}, arguments=pair, idx=0) for pair in pairs]
    return [ll for ll, _ in lm.loglikelihood(requests, disable_tqdm=True)]


def reference_loglikelihoods(model, tokenizer, pairs):
    return [loglikelihoods(model, tokenizer, context, [continuation])[0] for context, continuation in pairs]


# ---------------------------------------------------------------------------------------------------------------
# names


def test_every_preset_task_exists_in_the_installed_lm_eval(lm_eval_index):
    names = {task for suite in PRESETS.values() for task, _, _ in suite}
    assert names >= {"arc_easy", "arc_challenge", "hellaswag", "piqa", "winogrande", "nq_open", "triviaqa", "mmlu",
                     "bbh_fewshot", "fda", "swde", "squad_completion", "drop"}
    assert sorted(names - lm_eval_index) == []
    assert check_tasks([TaskSpec(n) for n in names])  # and the public check agrees


def test_presets_resolve_with_their_shots_and_metrics(lm_eval_index):
    specs = {s.name: s for s in resolve_tasks("commonsense,aggregate", ["knowledge"])}
    assert (specs["arc_challenge"].num_fewshot, specs["arc_challenge"].metric) == (0, "acc_norm")
    assert (specs["mmlu"].num_fewshot, specs["mmlu"].metric) == (5, "acc")
    assert (specs["bbh_fewshot"].num_fewshot, specs["bbh_fewshot"].metric) == (3, "exact_match")
    assert (specs["nq_open"].num_fewshot, specs["triviaqa"].num_fewshot) == (5, 5)
    assert len(specs) == 9 and not any(s.is_local for s in specs.values())


def test_unknown_names_fail_with_a_suggestion(lm_eval_index):
    with pytest.raises(ValueError, match="did you mean 'hellaswag'"):
        resolve_tasks(None, ["hellaswg"])
    with pytest.raises(ValueError, match="'commonsense'"):
        resolve_tasks("comonsense", None)
    with pytest.raises(ValueError, match="not found"):
        resolve_tasks(None, ["missing/file.jsonl"])
    assert [s.name for s in resolve_tasks(None, ["hellaswag"], num_fewshot=10)] == ["hellaswag"]


def test_local_files_and_directories_resolve_to_absolute_paths(tmp_path, monkeypatch):
    data = tmp_path / "mc"
    data.mkdir()
    write_jsonl(data / "alpha.jsonl", ITEMS[:3])
    write_jsonl(data / "beta.jsonl", ITEMS[3:5])
    monkeypatch.chdir(tmp_path)

    (spec,) = resolve_tasks(None, ["mc/alpha.jsonl"])  # relative to the CWD; needs no lm-eval index
    assert (spec.name, spec.num_fewshot, spec.metric, spec.is_local) == ("alpha", 0, "acc", True)
    path = spec.config["dataset_kwargs"]["data_files"]["test"]
    assert Path(path).is_absolute() and Path(path) == (data / "alpha.jsonl").resolve()
    assert (spec.config["target_delimiter"], spec.config["output_type"]) == ("", "multiple_choice")

    assert [s.name for s in resolve_tasks(None, ["mc", "mc/alpha.jsonl"])] == ["alpha", "beta"]  # dedup
    assert set(local_task(data)) == {"alpha", "beta"} and local_task(data / "beta.jsonl")["task"] == "beta"
    monkeypatch.setenv(LOCAL_DATA_ENV, str(data))
    assert [s.name for s in resolve_tasks("local", None)] == ["alpha", "beta"]


# ---------------------------------------------------------------------------------------------------------------
# lm-eval and the reference scorer agree


def test_tokenisation_matches_lm_eval(tiny):
    model, tokenizer = tiny
    context_ids, continuation_ids = encode_pair(tokenizer, "Answer: ", "yes")  # the space moves over
    assert tokenizer.decode(context_ids) == "Answer:" and tokenizer.decode(continuation_ids) == " yes"
    pairs = [("The river was", " quiet"), ("Answer: ", "yes"), ("Tea or", " coffee?"), ("", " Birds flew")]
    ours = reference_loglikelihoods(model, tokenizer, pairs)
    theirs = hflm_loglikelihoods(model, tokenizer, pairs)
    assert ours == pytest.approx(theirs, abs=1e-4)
    assert len(set(round(x, 3) for x in ours)) == len(pairs)  # distinct requests, not one repeated number


def test_local_task_through_lm_eval_equals_the_reference_scorer(tiny, tmp_path):
    model, tokenizer = tiny
    path = write_jsonl(tmp_path / "mc.jsonl", ITEMS)
    ref = score_multiple_choice(model, tokenizer, path)
    assert ref["n"] == len(ITEMS) and ref["acc"] != ref["acc_norm"]  # the items tell the two metrics apart

    out = run_harness(model, tokenizer, resolve_tasks(None, [str(path)]), batch_size=4, max_length=256)
    assert out["lm_eval_version"].startswith("0.")
    got = out["tasks"]["mc"]
    assert (got["metric"], got["n"], got["num_fewshot"]) == ("acc", len(ITEMS), 0)
    assert got["value"] == ref["acc"]
    assert got["all"]["acc_norm,none"] == ref["acc_norm"]
    assert got["all"]["acc_bytes,none"] == ref["acc_bytes"]
    assert got["stderr"] == pytest.approx((ref["acc"] * (1 - ref["acc"]) / (len(ITEMS) - 1)) ** 0.5)

    few = run_harness(model, tokenizer, resolve_tasks(None, [str(path)]), limit=5, batch_size=2, max_length=256)
    ref5 = score_multiple_choice(model, tokenizer, path, limit=5)
    assert (few["tasks"]["mc"]["n"], few["tasks"]["mc"]["value"]) == (5, ref5["acc"])


def test_lm_eval_command_line_runs_a_converted_checkpoint(tiny, tmp_path):
    """`python -m t2r.lm_eval --model hf` loads a saved t2r_llama (plain lm-eval cannot), offline, and
    prints the same accuracy as the reference scorer."""
    model, tokenizer = tiny
    converted = t2r.convert(model, "gsa", num_slots=4).eval()
    converted.save_pretrained(tmp_path / "converted")
    tokenizer.save_pretrained(tmp_path / "converted")
    data = write_jsonl(tmp_path / "mc.jsonl", ITEMS)
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "t2r_mc.yaml").write_text(
        "task: t2r_mc\ndataset_path: json\n"
        f"dataset_kwargs: {{data_files: {{test: {json.dumps(str(data))}}}}}\n"
        "test_split: test\noutput_type: multiple_choice\n"
        "doc_to_text: query\ndoc_to_choice: choices\ndoc_to_target: gold\ntarget_delimiter: ''\n"
        "metric_list: [{metric: acc}, {metric: acc_norm}]\nmetadata: {version: 1.0}\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(tmp_path / "hf_datasets")}
    cmd = [sys.executable, "-m", "t2r.lm_eval", "--model", "hf",
           "--model_args", f"pretrained={tmp_path / 'converted'},max_length=256,dtype=float32",
           "--device", "cpu", "--batch_size", "4", "--tasks", "t2r_mc", "--include_path", str(tasks),
           "--limit", "6"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {}
    for line in proc.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 7 and cells[4] in ("acc", "acc_norm"):
            rows[cells[4]] = float(cells[6])
    ref = score_multiple_choice(converted, tokenizer, data, limit=6)
    assert rows == {"acc": pytest.approx(ref["acc"], abs=1e-4), "acc_norm": pytest.approx(ref["acc_norm"], abs=1e-4)}
    assert re.search(r"\|\s*t2r_mc\s*\|", proc.stdout)


# ---------------------------------------------------------------------------------------------------------------
# a real model and its BPE tokenizer

EASY = [
    {"query": "The capital of France is", "choices": [" Paris", " London"], "gold": 0},
    {"query": "Water freezes at zero degrees", "choices": [" Celsius", " Kelvin"], "gold": 0},
    {"query": "The opposite of hot is", "choices": [" blue", " cold"], "gold": 1},
    {"query": "One, two, three, four,", "choices": [" five", " eleven"], "gold": 0},
    {"query": "A dog says woof and a cat says", "choices": [" moo", " meow"], "gold": 1},
    {"query": "The sun rises in the", "choices": [" east", " west"], "gold": 0},
    {"query": "Monday, Tuesday,", "choices": [" Wednesday", " December"], "gold": 0},
    {"query": "Ice is frozen", "choices": [" water", " sand"], "gold": 0},
    {"query": "If you add more resistors in series, the total resistance", "choices": [" increases", " decreases"],
     "gold": 0},
    {"query": "The grass is", "choices": [" green", " purple and made of small metal wires"], "gold": 0},
]


@pytest.mark.slow
def test_smollm2_through_lm_eval_equals_the_reference_scorer(tmp_path):
    from t2r.sources import load_source

    try:
        model, tokenizer = load_source("smollm2")
    except RuntimeError as err:  # no network and no cached copy
        pytest.skip(str(err))
    pairs = [(item["query"], c) for item in EASY[:4] for c in item["choices"]] + [("The sky is ", "blue")]
    assert reference_loglikelihoods(model, tokenizer, pairs) == pytest.approx(
        hflm_loglikelihoods(model, tokenizer, pairs), abs=1e-3)

    path = write_jsonl(tmp_path / "easy.jsonl", EASY)
    ref = score_multiple_choice(model, tokenizer, path)
    assert ref["acc"] >= 0.8  # a working model, not chance
    got = run_harness(model, tokenizer, resolve_tasks(None, [str(path)]), batch_size=4, max_length=512)["tasks"]["easy"]
    assert (got["n"], got["value"], got["all"]["acc_norm,none"]) == (len(EASY), ref["acc"], ref["acc_norm"])
