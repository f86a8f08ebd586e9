"""t2r.eval.bench on tiny CPU models: exact cache sizes, OOM handling, the table, the plots, size parsing."""

import math
import sys
import warnings
from types import SimpleNamespace

import pytest
import torch

import t2r
from t2r.eval.bench import BenchRow, bench_model, cache_bytes, format_table, parse_sizes, plot
from t2r.models.generation_cache import generation_memory
from tests.helpers.models import tiny_source

CONTEXTS = (16, 64, 128)
DECODE = 4
FAST = dict(decode_tokens=DECODE, warmup=1, repeats=1)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def source():
    return tiny_source("llama")


def kv_bytes(config, tokens: int, batch: int, element_size: int = 4) -> int:
    head_dim = config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * element_size * tokens * batch


@pytest.mark.parametrize("target", ["gsa", "gla"])
def test_recurrent_cache_is_constant_and_matches_generation_memory(source, target):
    model = t2r.convert(source, target).eval()
    rows = bench_model(model, target, CONTEXTS, [1, 3], **FAST)
    assert [r.status for r in rows] == ["ok"] * 6
    fixed, per_token = generation_memory(model.config, element_size=4)
    assert per_token == 0 and fixed > 0
    for r in rows:
        assert r.cache_bytes == fixed * r.batch
        assert r.weights_bytes == sum(p.numel() * 4 for p in model.parameters()) + sum(
            b.numel() * b.element_size() for b in model.buffers())
        for value in (r.prefill_tokens_per_s, r.decode_ms_per_token, r.decode_tokens_per_s):
            assert value > 0 and math.isfinite(value)
        assert r.decode_tokens_per_s == pytest.approx(r.batch * 1000 / r.decode_ms_per_token)
        assert r.peak_memory_bytes is None or r.peak_memory_bytes >= 0


def test_source_kv_cache_grows_with_context(source):
    rows = bench_model(source, "source", CONTEXTS, [2], **FAST)
    assert [r.status for r in rows] == ["ok"] * 3
    for r in rows:
        assert r.cache_bytes == kv_bytes(source.config, r.context + DECODE, r.batch)
        assert r.cache_bytes == generation_memory(source.config, 4)[1] * (r.context + DECODE) * r.batch
    assert rows[2].cache_bytes / rows[0].cache_bytes == (CONTEXTS[2] + DECODE) / (CONTEXTS[0] + DECODE)


def test_fox_cache_counts_gates(source):
    model = t2r.convert(source, "fox").eval()
    (row,) = bench_model(model, "fox", [32], [2], **FAST)
    fixed, per_token = generation_memory(model.config, 4)
    assert row.cache_bytes == (fixed + per_token * (32 + DECODE)) * 2 > kv_bytes(source.config, 32 + DECODE, 2)


def test_cache_bytes_counts_each_storage_once():
    t = torch.zeros(4, 8)
    layer = SimpleNamespace(keys=t, values=t, view=t[:2], states={0: torch.zeros(3), 1: None}, nested=[(t,)])
    assert cache_bytes(SimpleNamespace(layers=[layer])) == 4 * 8 * 4 + 3 * 4


@pytest.mark.parametrize("error", [
    torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"),
])
def test_oom_row_and_sweep_goes_on(source, monkeypatch, error):
    model = t2r.convert(source, "gla").eval()
    forward = model.forward

    def failing_forward(input_ids=None, **kwargs):
        if input_ids is not None and input_ids.shape[1] == 64:
            raise error
        return forward(input_ids=input_ids, **kwargs)

    monkeypatch.setattr(model, "forward", failing_forward)
    rows = bench_model(model, "gla", CONTEXTS, [1], **FAST)
    assert [r.status for r in rows] == ["ok", "OOM", "ok"]
    assert rows[1].cache_bytes is None and rows[1].prefill_tokens_per_s is None
    assert rows[2].cache_bytes == rows[0].cache_bytes > 0


def test_an_input_too_large_for_memory_is_an_oom_row(source):
    """`t2r bench --batch-sizes 1000000000`: allocating the inputs themselves fails; before, it ended the command."""
    model = t2r.convert(source, "gla").eval()
    rows = bench_model(model, "gla", [16], [1, 10**12, 1], **FAST)
    assert [r.status for r in rows] == ["ok", "OOM", "ok"]


def test_other_errors_are_reported(source, monkeypatch):
    model = t2r.convert(source, "gla").eval()

    def broken(*args, **kwargs):
        raise ValueError("shapes do not match\nmore detail")

    monkeypatch.setattr(model, "forward", broken)
    (row,) = bench_model(model, "gla", [16], [1], **FAST)
    assert row.status == "error: ValueError: shapes do not match"


def test_position_limit_only_for_softmax_models(source):
    limit = source.config.max_position_embeddings
    rows = bench_model(source, "source", [limit * 2], [1], **FAST)
    assert rows[0].status == "beyond max_position_embeddings" and rows[0].prefill_tokens_per_s is None
    assert bench_model(source, "source", [limit + 8], [1], allow_beyond=True, **FAST)[0].status == "ok"
    fox = t2r.convert(source, "fox", layers=[0]).eval()
    assert bench_model(fox, "fox", [limit * 2], [1], **FAST)[0].status == "beyond max_position_embeddings"
    gsa = t2r.convert(source, "gsa").eval()
    assert bench_model(gsa, "gsa", [limit * 2], [1], **FAST)[0].status == "ok"


def test_same_inputs_for_every_model(source, monkeypatch):
    seen = []
    for target in ("gsa", "gla"):
        model = t2r.convert(source, target).eval()
        forward = model.forward

        def recording(input_ids=None, _forward=forward, **kwargs):
            if input_ids.shape[1] > 1:
                seen.append(input_ids.clone())
            return _forward(input_ids=input_ids, **kwargs)
        monkeypatch.setattr(model, "forward", recording)
        bench_model(model, target, [16], [2], **FAST)
    assert len(seen) == 4 and all(torch.equal(seen[0], s) for s in seen)
    assert seen[0].min() >= 10 and seen[0].max() < source.config.vocab_size


def rows_for_table():
    return [
        BenchRow("source", 16, 1, 1000.0, 2.0, 500.0, 2 * 2**20, 10 * 2**20, 2**20),
        BenchRow("gsa", 16, 1, 900.0, 2.5, 400.0, 2**20, 9 * 2**20, 2**20),
        BenchRow("source", 32, 1, 1100.0, 2.2, 454.5, 4 * 2**20, 12 * 2**20, 2**20),
        BenchRow("gsa", 32, 1, 950.0, 2.4, 416.7, 2**20, 9 * 2**20, 2**20),
        BenchRow("source", 64, 1, status="OOM"),
        BenchRow("gsa", 64, 1, 960.0, 2.4, 416.7, 2**20, 9 * 2**20, 2**20),
    ]


def test_format_table():
    table = format_table(rows_for_table())
    lines = table.splitlines()
    assert len(lines) == 2 + 3 + 2 and lines[-1].startswith("cache MiB: the generation cache's tensors")
    assert "source prefill tok/s" in lines[0] and "gsa peak MiB" in lines[0]
    assert lines[0].count("|") == lines[2].count("|") == 2 + 2 * 5 + 1
    assert lines[2].startswith("| 16 | 1 | 1,000 | 2.00 | 500 | 2.00 | 10.0 | 900 |")
    assert lines[4].startswith("| 64 | 1 | OOM |") and "| 960 |" in lines[4]


def test_cpu_tables_leave_peak_memory_out_and_say_why():
    rows = [BenchRow(r.model, r.context, r.batch, r.prefill_tokens_per_s, r.decode_ms_per_token,
                     r.decode_tokens_per_s, r.cache_bytes, None, r.weights_bytes, r.status) for r in rows_for_table()]
    lines = format_table(rows).splitlines()
    assert "peak MiB" not in lines[0] and lines[0].count("|") == lines[2].count("|") == 2 + 2 * 4 + 1
    assert "no peak MiB on CPU" in lines[-1]


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    rows = rows_for_table() + [BenchRow("gsa", 16, 4, 900.0, 2.5, 1600.0, 4 * 2**20, None, 2**20)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no legend without labelled series, no tick-label warnings
        paths = plot(rows, tmp_path / "plots")
    assert [p.name for p in paths] == ["memory_vs_context.png", "decode_vs_context.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 1000


def test_plot_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"pip install -e \.\[eval\]"):
        plot(rows_for_table(), tmp_path)


def test_parse_sizes():
    assert parse_sizes("1K,2K,512") == [1024, 2048, 512]
    assert parse_sizes(" 4k , 16 ") == [4096, 16]
    for bad in ("1K,x", "1M", "0", "-4", "1K,,2K", ""):
        with pytest.raises(ValueError, match="bad size"):
            parse_sizes(bad)
    with pytest.raises(ValueError, match="'1M'"):
        parse_sizes("512,1M")


def test_static_decode_rows_for_a_converted_model_and_its_source(source):
    """decode="static": the converted model's state buffers (its fixed state, whatever the context) and the
    source's StaticCache (context + steps slots, preallocated); a hybrid gets a clear status, not a crash."""
    model = t2r.convert(source, "gsa", num_slots=8).eval()
    rows = bench_model(model, "gsa", (16, 64), [2], decode="static", **FAST)
    fixed, _ = generation_memory(model.config, element_size=4)
    assert [r.status for r in rows] == ["ok", "ok"] and all(r.cache_bytes == fixed * 2 for r in rows)
    assert all(r.decode_tokens_per_s > 0 and r.prefill_tokens_per_s > 0 for r in rows)
    source_rows = bench_model(source, "source", (16,), [2], decode="static", **FAST)
    assert source_rows[0].status == "ok"
    steps = 2 + DECODE * FAST["repeats"]  # warm-up and timed steps all fit in the preallocated cache
    assert source_rows[0].cache_bytes == kv_bytes(source.config, 16 + steps + 1, 2)
    hybrid = t2r.convert(source, "gsa", num_slots=8, layers=[0]).eval()
    assert bench_model(hybrid, "hybrid", (16,), [1], decode="static", **FAST)[0].status.startswith("static decoding")
    with pytest.raises(ValueError, match="decode="):
        bench_model(model, "gsa", (16,), [1], decode="graph")
