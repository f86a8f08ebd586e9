"""KL to the source by position (`t2r.eval.divergence`), and held-out texts scored one by one: the KL suite's
values, its frontier, and a report that says on which text each verdict holds."""

import json

import pytest
import torch

from t2r.eval import frontier
from t2r.eval.contenders import Contender
from t2r.eval.divergence import pool_kl_by_position, position_kl, token_kl
from t2r.eval.report import write
from t2r.eval.settings import EvalSettings
from tests.eval.test_frontier import run, tiny  # noqa: F401 (the module fixture)
from tests.helpers.data import write_words
from tests.helpers.models import tiny_source


def test_token_kl_is_the_written_out_sum():
    p_logits, q_logits = torch.randn(2, 5, 11), torch.randn(2, 5, 11)
    p, q = p_logits.softmax(-1), q_logits.softmax(-1)
    expected = (p * (p.log() - q.log())).sum(-1)
    torch.testing.assert_close(token_kl(p_logits, q_logits), expected, rtol=1e-5, atol=1e-6)
    assert token_kl(p_logits, p_logits).abs().max() == 0


def test_pooling_uses_the_predicted_tokens_positions():
    kl = torch.arange(1, 100, dtype=torch.float32)[None].expand(2, -1)  # token predicted at position t: t
    pooled = pool_kl_by_position("x", kl)
    assert [(b["start"], b["end"], b["tokens"]) for b in pooled["buckets"]] == [(0, 64, 126), (64, 100, 72)]
    assert pooled["buckets"][0]["kl"] == pytest.approx(32.0) and pooled["kl"] == pytest.approx(50.0)


def test_the_source_to_itself_is_zero_and_windows_grow_with_distance():
    """The source scored as a second contender (a separate forward of the same weights) is exactly 0 away; a
    window of it is 0 while everything is inside the window and grows beyond it, more for a smaller window."""
    source = tiny_source("llama").eval()
    ids = torch.randint(3, 97, (3, 96), generator=torch.Generator().manual_seed(0))
    reference = Contender("source", source, role="baseline")
    found = [reference, Contender("again", source, role="model"), Contender("window 8+2", source, 8, 2, "window"),
             Contender("window 32+2", source, 32, 2, "window")]
    scored = {r["name"]: r for r in position_kl(found, reference, ids, batch_size=2)}
    assert scored["source"]["kl"] == 0 and scored["again"]["kl"] == 0
    small, large = scored["window 8+2"]["buckets"], scored["window 32+2"]["buckets"]
    assert small[1]["kl"] > large[1]["kl"] > large[0]["kl"] > 0  # 64-96 beyond 0-64; the smaller window further
    assert small[0]["kl"] > large[0]["kl"]
    per_token = token_kl(reference.logits(ids), found[3].logits(ids))  # position t reads t + 1 tokens
    assert per_token[:, :34].abs().max() < 1e-5 < per_token[:, 34:].mean()  # all of them inside 32 + 2


def test_kl_and_two_texts_in_one_report(tiny, tmp_path):  # noqa: F811
    """--data A,B scores perplexity and KL on each text; the frontier judges each text's late buckets on their
    own (the first text's unlabelled, the other's named), and the report says which text each line is about."""
    first = write_words(tmp_path / "first.jsonl", documents=4, words=400)
    second = write_words(tmp_path / "other-domain.jsonl", documents=4, words=400)
    results = run(tiny, tmp_path / "out", suites=["ppl", "kl"], data=f"{first},{second}", windows=[8, 32],
                  students=[])
    assert results["perplexity"]["label"] == "first" and results["kl"]["label"] == "first"
    assert [t["label"] for t in results["texts"]] == ["other-domain"]
    kl_rows = {r["name"]: r for r in results["texts"][0]["kl"]["results"]}
    assert kl_rows["source"]["kl"] == 0 and kl_rows["gsa"]["kl"] > 0
    measures = {f["measure"] for f in results["frontier"]}
    assert {"ppl 64-96", "kl 64-96", "ppl 64-96 [other-domain]", "kl 64-96 [other-domain]"} <= measures
    kl_frontier = next(f for f in results["frontier"] if f["measure"] == "kl 64-96")
    assert kl_frontier["curve"][-1] == {"name": "source", "memory": kl_frontier["curve"][-1]["memory"], "value": 0.0}
    report = write(results, tmp_path / "out").read_text()
    for heading in ("## Perplexity by position: first", "## KL to the source by position: other-domain"):
        assert heading in report
    assert "- perplexity on other-domain:" in report and "- KL to source on first:" in report
    assert "- frontier, kl 64-96 [other-domain] at 96 tokens: gsa" in report
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["texts"][0]["perplexity"]["data"] == str(second)
    assert frontier.summary_lines(results)


def test_kl_without_a_baseline_and_bad_data_lists_are_refused(tiny, tmp_path):  # noqa: F811
    from t2r.eval.models import load_pair
    from t2r.eval.suite import evaluate

    model, tok, *_ = load_pair(str(tiny / "gsa"), "none", "float32", "cpu")
    with pytest.raises(ValueError, match="kl suite scores KL to the baseline"):
        evaluate(model, tok, EvalSettings(suites=["kl"], device="cpu", cache=False), tmp_path)
    with pytest.raises(ValueError, match="distinct texts joined by single commas"):
        EvalSettings(data="a.jsonl,,b.jsonl")
