"""t2r.eval.train_bench on tiny CPU models: the training loop trains, sizes and statuses, the table."""

import warnings

import pytest
import torch

import t2r
from t2r.eval.train_bench import TrainRow, bench_training, format_train_table, plot_training, training_steps
from tests.helpers.models import tiny_source

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_steps_train_every_parameter_and_see_the_batch():
    model = t2r.convert(tiny_source("llama"), "gsa")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    seen = []
    ms, tokens, peak = training_steps(model, context=24, tokens_per_step=50, warmup=1, steps=2,
                                      check_first=lambda ids, loss: seen.append((ids.shape, loss.item())))
    assert tokens == 2 * 24 and ms > 0 and peak is None  # CPU: not reported (see the module)
    assert len(seen) == 1 and seen[0][0] == (2, 24) and seen[0][1] > 0
    unchanged = [n for n, p in model.named_parameters() if torch.equal(p, before[n])]
    assert unchanged == []  # three AdamW steps move every weight, the new gates included
    assert not model.training and all(p.grad is None for p in model.parameters())


def test_bad_step_counts_are_refused():
    with pytest.raises(ValueError, match="at least one timed step"):
        training_steps(tiny_source("llama"), 16, 16, steps=0)


def test_sweep_rows_and_a_failing_cell(monkeypatch):
    model = tiny_source("llama")
    real = model.forward

    def forward(*args, input_ids=None, **kwargs):
        if input_ids.shape[1] == 32:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(*args, input_ids=input_ids, **kwargs)

    monkeypatch.setattr(model, "forward", forward)
    rows = bench_training(model, "source", [16, 32, 64], steps=1)  # default: 64 tokens per step
    assert [(r.context, r.batch, r.status) for r in rows] == [(16, 4, "ok"), (32, 2, "OOM"), (64, 1, "ok")]
    assert rows[1].tokens_per_s is None and rows[0].tokens_per_s > 0


def test_table_ratios_against_the_reference():
    rows = [TrainRow("gsa", 16, 4, 300.0, 10.0, 2**20), TrainRow("gsa", 32, 2, status="OOM"),
            TrainRow("source", 16, 4, 200.0, 15.0, None), TrainRow("source", 32, 2, 100.0, 30.0, 2**21)]
    lines = format_train_table(rows, reference="source").splitlines()
    assert lines[0] == "| model | context | batch | tokens/s | x source | step ms | peak MiB |"
    assert lines[2] == "| gsa | 16 | 4 | 300 | 1.50 | 10.0 | 1 |"
    assert lines[3] == "| gsa | 32 | 2 | OOM | - | - | - |"
    assert lines[4] == "| source | 16 | 4 | 200 | 1.00 | 15.0 | n/a |"
    assert "x source" not in format_train_table(rows)


def test_cpu_rows_plot_without_a_peak_panel_or_an_empty_legend(tmp_path):
    pytest.importorskip("matplotlib")
    rows = [TrainRow("gsa", 256, 4, 150.0, 6.8, None), TrainRow("gsa", 1024, 1, 140.0, 7.3, None),
            TrainRow("source", 256, 4, 210.0, 4.9, None), TrainRow("source", 1024, 1, 185.0, 5.5, None)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "No artists with labels found to put in legend" was one
        [path] = plot_training(rows, tmp_path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
