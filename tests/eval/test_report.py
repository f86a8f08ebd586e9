"""The report: recovered shares, the summary's verdict against window baselines, tables from results."""

import math

import pytest

from t2r.eval.report import markdown, recovered, summary_lines


def test_recovered_for_higher_and_lower_is_better():
    assert recovered(0.6, 0.8) == pytest.approx(75.0)  # accuracy: model / baseline
    assert recovered(12.0, 10.0, higher_is_better=False) == pytest.approx(100 * 10 / 12)  # perplexity: baseline / model
    assert recovered(8.0, 10.0, higher_is_better=False) == pytest.approx(125.0)  # better than the baseline
    assert recovered(0.5, 0.0) is None and recovered(math.nan, 1.0) is None and recovered(None, 1.0) is None


def _ppl_row(name, role, ppls, edges=(0, 64, 256, 512)):
    buckets = [{"start": lo, "end": hi, "tokens": 10, "nll": math.log(p), "ppl": p}
               for lo, hi, p in zip(edges[:-1], edges[1:], ppls)]
    return {"name": name, "role": role, "buckets": buckets, "ppl": ppls[-1], "nll": math.log(ppls[-1]), "tokens": 30}


def _results(model_late: float) -> dict:
    return {
        "command": "t2r eval ...", "names": {"model": "gsa", "baseline": "source"},
        "settings": {"dtype": "float32", "seed": 0},
        "environment": {"device": "cpu", "torch": "x", "transformers": "y", "t2r": "z", "lm_eval": None},
        "models": {}, "seconds": {},
        "perplexity": {"data": "d.jsonl", "length": 512, "rows": 2, "pack": False, "results": [
            _ppl_row("gsa", "model", [40.0, 20.0, model_late]),
            _ppl_row("source", "baseline", [40.0, 10.0, 5.0]),
            _ppl_row("window 64+4", "window", [40.0, 15.0, 18.0]),
        ]},
        "mqar": {"pairs": [8, 32], "tokens": [74, 266], "count": 2,
                 "accuracy": {"gsa": [0.5, 0.0], "source": [1.0, 0.75], "window 64+4": [1.0, 0.25]}},
        "tasks": {"gsa": {"tasks": {"piqa": {"metric": "acc", "value": 0.6}}},
                  "source": {"tasks": {"piqa": {"metric": "acc", "value": 0.75}}}},
    }


def test_summary_says_whether_the_model_beats_a_window_of_its_memory():
    lines = "\n".join(summary_lines(_results(model_late=25.0)))
    assert "beats 0 of 1 window baselines" in lines and "would do as well" in lines
    lines = "\n".join(summary_lines(_results(model_late=12.0)))
    assert "beats 1 of 1 window baselines (window 64+4)" in lines
    assert "mqar: mean accuracy 0.25 vs 0.88" in lines
    assert "80.0% of the baseline" in lines  # piqa 0.6 / 0.75


def test_markdown_tables_carry_every_row_and_bucket():
    text = markdown(_results(model_late=12.0))
    assert "| model | 0-64 | 64-256 | 256-512 | all |" in text
    assert "| window 64+4 | 40.00 | 15.00 | 18.00 | 18.00 |" in text
    assert "| piqa | acc | 0.750 | 0.600 | 80.0% |" in text
    assert "| 32 (266) | 0.00 | 0.75 | 0.25 |" in text
