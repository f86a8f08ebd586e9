"""The window frontier (`t2r.eval.frontier`): memory per contender, interpolation, the verdict on a constructed
example, and on a tiny model: the curve's points are the scores of separate window runs."""

import json

import pytest

from t2r.cli import main
from t2r.eval import frontier
from t2r.eval.models import load_pair
from t2r.eval.settings import EvalSettings
from t2r.eval.suite import evaluate
from tests.helpers.models import save_tiny_source

PER_TOKEN = 1024  # the source's KV bytes per token in the constructed example


def contender(name, role, window=None, sinks=0, state=0, per_token=PER_TOKEN, windowed=False):
    return {"name": name, "role": role, "window": window, "sinks": sinks, "state_bytes": state,
            "bytes_per_token": per_token, "windowed": windowed}


def constructed(model_ppl: float, model_mqar: float, model_state: int, model_per_token: int = 0) -> dict:
    """A 2K-token evaluation: windows 32, 128, 512 (+4 sinks) of a source, a model, perplexity of 1K-2K, MQAR."""
    windows = {32: (30.0, 0.1), 128: (20.0, 0.3), 512: (14.0, 0.6)}
    contenders = [contender("gsa", "model", state=model_state, per_token=model_per_token),
                  contender("source", "baseline", windowed=True),
                  *[contender(f"window {w}+4", "window", w, 4) for w in windows]]
    ppl = {"gsa": model_ppl, "source": 10.0, **{f"window {w}+4": v[0] for w, v in windows.items()}}
    mqar = {"gsa": [model_mqar], "source": [0.9], **{f"window {w}+4": [v[1]] for w, v in windows.items()}}
    bucket = lambda value: {"start": 1024, "end": 2048, "ppl": value}  # noqa: E731
    return {"contenders": contenders,
            "perplexity": {"results": [{"name": n, "buckets": [{"start": 0, "end": 1024, "ppl": 1.0}, bucket(v)]}
                                       for n, v in ppl.items()]},
            "mqar": {"pairs": [64], "tokens": [2048], "accuracy": mqar}}


def test_memory_of_windows_models_and_hybrids():
    window = contender("w", "window", 64, 4)
    assert frontier.memory(window, 2048) == 68 * PER_TOKEN and frontier.memory(window, 50) == 50 * PER_TOKEN
    assert frontier.memory(contender("rnn", "model", state=5000, per_token=0), 8192) == 5000
    hybrid = contender("hybrid", "model", state=5000, per_token=256)  # a quarter of the layers keep softmax
    assert frontier.memory(hybrid, 2048) == 5000 + 256 * 2048 and frontier.memory(hybrid, 8192) == 5000 + 256 * 8192


def test_the_frontier_is_the_window_curve_interpolated_in_log_memory():
    results = constructed(model_ppl=15.0, model_mqar=0.5, model_state=(256 + 4) * PER_TOKEN)
    ppl, mqar = frontier.frontiers(results)
    assert [p["name"] for p in ppl["curve"]] == ["window 32+4", "window 128+4", "window 512+4", "source"]
    assert ppl["curve"][-1]["memory"] == 2048 * PER_TOKEN
    point = ppl["points"][0]
    share = (frontier.math.log(260) - frontier.math.log(132)) / (frontier.math.log(516) - frontier.math.log(132))
    assert point["frontier"] == pytest.approx(20.0 + share * (14.0 - 20.0))
    assert point["where"] == "between window 128+4 and window 512+4"
    assert mqar["points"][0]["frontier"] == pytest.approx(0.3 + share * 0.3)


@pytest.mark.parametrize("model_ppl, model_mqar, ppl_says, mqar_says", [
    (15.0, 0.5, "below the frontier by 2.02 (12%) (better)", "above the frontier by 0.05 (better)"),
    (19.0, 0.3, "above the frontier by 1.98 (12%) (worse)", "below the frontier by 0.15 (worse)")])
def test_the_summary_says_below_or_above_and_by_how_much(model_ppl, model_mqar, ppl_says, mqar_says):
    results = constructed(model_ppl, model_mqar, model_state=(256 + 4) * PER_TOKEN)  # frontier: 17.02 and 0.449
    results["frontier"] = frontier.frontiers(results)
    lines = frontier.summary_lines(results)
    assert len(lines) == 2
    assert lines[0].startswith("- frontier, ppl 1K-2K at 2K tokens: gsa") and lines[0].endswith(ppl_says)
    assert lines[1].startswith("- frontier, mqar 64 pairs at 2K tokens: gsa") and lines[1].endswith(mqar_says)
    assert "260 KiB" in lines[0] and "the windows' 17.02 there" in lines[0]


def test_outside_the_sweep_the_nearest_end_is_named():
    small = constructed(model_ppl=25.0, model_mqar=0.0, model_state=10 * PER_TOKEN)
    point = frontier.frontiers(small)[0]["points"][0]
    assert point["frontier"] == 30.0 and "the smallest window, which takes more memory" in point["where"]
    assert point["better"]  # less memory than any window and still better than the smallest
    hybrid = constructed(model_ppl=11.0, model_mqar=0.9, model_state=0, model_per_token=2 * PER_TOKEN)
    point = frontier.frontiers(hybrid)[0]["points"][0]
    assert point["frontier"] == 10.0 and point["where"] == "source, the far end" and not point["better"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("frontier")
    source = save_tiny_source(root / "source")
    for target, flags in (("gsa", ["--num-slots", "4"]), ("gla", [])):
        assert main(["convert", "--model", str(source), "--to", target, *flags, "--out", str(root / target),
                     "--device", "cpu"]) == 0
    return root


def run(tiny, out, **changes):
    settings = EvalSettings(**{**dict(suites=["ppl", "passkey"], ppl_length=96, ppl_rows=2, sinks=2,
                                      passkey_lengths=[200], passkey_depths=[0, 1], passkey_prompts=1, device="cpu",
                                      dtype="float32", cache=False), **changes})
    model, tok, baseline, base_tok, spec = load_pair(str(tiny / "gsa"), str(tiny / "source"), "float32", "cpu")
    return evaluate(model, tok, settings, out, baseline=baseline, baseline_tokenizer=base_tok,
                    model_spec=str(tiny / "gsa"), baseline_spec=spec)


def test_the_curve_is_made_of_separate_window_runs(tiny, tmp_path):
    from t2r.eval.report import write

    windows = [8, 16, 32]
    results = run(tiny, tmp_path / "sweep", windows=windows, students=[str(tiny / "gla")])
    by_measure = {f["measure"]: f for f in results["frontier"]}
    assert set(by_measure) == {"ppl 64-96", "passkey 200"}
    per_token = next(c for c in results["contenders"] if c["name"] == "source")["bytes_per_token"]
    for w in windows:
        alone = run(tiny, tmp_path / f"w{w}", windows=[w])
        name = f"window {w}+2"
        row = next(r for r in alone["perplexity"]["results"] if r["name"] == name)
        point = next(p for p in by_measure["ppl 64-96"]["curve"] if p["name"] == name)
        assert point["value"] == row["buckets"][-1]["ppl"] and point["memory"] == (w + 2) * per_token
        passkey = next(p for p in by_measure["passkey 200"]["curve"] if p["name"] == name)
        assert passkey["value"] == sum(alone["passkey"]["accuracy"][name][0]) / 2
    assert by_measure["ppl 64-96"]["curve"][-1]["name"] == "source"
    assert [p["role"] for p in by_measure["ppl 64-96"]["points"]] == ["model", "student"]
    assert by_measure["ppl 64-96"]["points"][1]["name"] == "gla (gla)"
    report = write(results, tmp_path / "sweep").read_text()
    assert (tmp_path / "sweep" / "frontier.png").stat().st_size > 10_000
    assert "## Window frontier" in report and "- frontier, ppl 64-96 at 96 tokens: gsa" in report
    saved = json.loads((tmp_path / "sweep" / "results.json").read_text())
    assert saved["frontier"] == json.loads(json.dumps(results["frontier"]))
