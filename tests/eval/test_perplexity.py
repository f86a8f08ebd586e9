"""Perplexity by position (`t2r.eval.perplexity`): pooling, token NLL and contenders scored alike."""

import math

import pytest
import torch
import torch.nn.functional as F

from t2r.eval.contenders import Contender
from t2r.eval.perplexity import bucket_edges, pool_by_position, position_perplexity, token_nll
from tests.helpers.models import ARCHS, random_ids, tiny_source

# --- pool_by_position -------------------------------------------------------------------------------------------

def test_bucket_edges():
    assert bucket_edges(300) == [0, 64, 256, 300]
    assert bucket_edges(64) == [0, 64]
    assert bucket_edges(1024) == [0, 64, 256, 1024]
    assert bucket_edges(5000) == [0, 64, 256, 1024, 2048, 4096, 5000]


@pytest.mark.parametrize("edges", [[0, 64, 256, 300], None])  # None: the default edges for T=300 are the same
def test_pool_by_position_matches_direct_means(edges):
    torch.manual_seed(0)
    N, T = 5, 300
    nll = torch.rand(N, T - 1) * 4 + torch.linspace(0, 2, T - 1)  # drifts with position, so buckets differ
    pooled = pool_by_position("m", nll, edges)
    # column c holds the NLL of token c + 1 (position c + 1): positions 1..63 are columns 0..62, and so on
    by_hand = [(0, 64, nll[:, 0:63]), (64, 256, nll[:, 63:255]), (256, 300, nll[:, 255:299])]
    assert [(b["start"], b["end"]) for b in pooled.buckets] == [(lo, hi) for lo, hi, _ in by_hand]
    for bucket, (_, _, chosen) in zip(pooled.buckets, by_hand):
        assert bucket["tokens"] == chosen.numel()
        assert bucket["nll"] == pytest.approx(chosen.double().mean().item(), rel=1e-12)
        assert bucket["ppl"] == pytest.approx(math.exp(chosen.double().mean().item()), rel=1e-12)
    assert [b["tokens"] for b in pooled.buckets] == [N * 63, N * 192, N * 44]
    assert sum(b["tokens"] for b in pooled.buckets) == N * (T - 1) == pooled.tokens
    assert pooled.nll == pytest.approx(nll.double().mean().item(), rel=1e-12)
    assert pooled.ppl == pytest.approx(math.exp(pooled.nll), rel=1e-12)
    # the overall mean is the token-weighted mean of the buckets
    weighted = sum(b["nll"] * b["tokens"] for b in pooled.buckets) / pooled.tokens
    assert pooled.nll == pytest.approx(weighted, rel=1e-9)
    assert pooled.to_dict()["buckets"] == pooled.buckets and pooled.to_dict()["name"] == "m"


def test_pool_by_position_skips_empty_buckets_and_caps_ppl():
    nll = torch.full((2, 9), 80.0)  # T = 10; ppl is capped at exp(50) instead of overflowing
    pooled = pool_by_position("m", nll, [0, 4, 4, 10])
    assert [(b["start"], b["end"], b["tokens"]) for b in pooled.buckets] == [(0, 4, 6), (4, 10, 12)]
    assert pooled.ppl == math.exp(50) and pooled.nll == pytest.approx(80.0)


# --- token_nll --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHS)
def test_token_nll_matches_cross_entropy_on_logits(arch):
    model = tiny_source(arch)
    ids = random_ids(3, 24, seed=3)
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    log_probs = logits[:, :-1].log_softmax(-1)
    direct = -log_probs.gather(-1, ids[:, 1:, None])[..., 0]
    reference = F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
    torch.testing.assert_close(reference, direct, atol=1e-5, rtol=1e-5)

    contender = Contender("m", model)
    one = token_nll(contender, ids, batch_size=1, progress=False)
    three = token_nll(contender, ids, batch_size=3, progress=False)
    two = token_nll(contender, ids, batch_size=2, progress=False)  # a last batch of one row
    assert one.shape == (3, 23) and one.dtype == torch.float32 and one.device.type == "cpu"
    torch.testing.assert_close(one, reference, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(three, one, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(two, one, atol=1e-5, rtol=1e-5)


def test_token_nll_of_a_window_matches_its_logits():
    model = tiny_source("llama")
    ids = random_ids(2, 20, seed=4)
    contender = Contender("w", model, window=4, sinks=1)
    logits = contender.logits(ids)
    reference = F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
    torch.testing.assert_close(token_nll(contender, ids, progress=False), reference, atol=1e-5, rtol=1e-5)
    full = token_nll(Contender("full", model), ids, progress=False)
    assert not torch.allclose(full[:, 10:], reference[:, 10:], atol=1e-3)  # the window is not the full model


# --- position_perplexity ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHS)
def test_position_perplexity_window_covering_rows_equals_source(arch):
    # sources with sliding layers get a window past the rows (a 4D mask replaces it; see test_contenders)
    model = tiny_source(arch, **({"sliding_window": 128} if arch in ("mistral", "gemma3_text") else {}))
    ids = random_ids(3, 80, seed=5)
    source, window = position_perplexity(
        [Contender("source", model), Contender("window", model, window=80, sinks=4)], ids, batch_size=2,
        progress=False)
    assert (source.name, window.name) == ("source", "window")
    assert [(b["start"], b["end"], b["tokens"]) for b in source.buckets] == [(0, 64, 3 * 63), (64, 80, 3 * 16)]
    assert source.tokens == window.tokens == 3 * 79
    assert source.nll == pytest.approx(window.nll, abs=1e-6)
    for a, b in zip(source.buckets, window.buckets, strict=True):
        assert (a["start"], a["end"], a["tokens"]) == (b["start"], b["end"], b["tokens"])
        assert a["nll"] == pytest.approx(b["nll"], abs=1e-6)
    # while a window shorter than the rows scores differently (a random model: not necessarily worse)
    short = position_perplexity([Contender("short", model, window=8)], ids, progress=False)[0]
    assert short.buckets[1]["nll"] != pytest.approx(source.buckets[1]["nll"], abs=1e-3)
