"""Window + sink baselines (`t2r.eval.contenders`): the mask, what a windowed softmax model can and cannot see,
and the window whose KV cache matches a converted model's state in bytes."""

import pytest
import torch

import t2r
from t2r.eval.contenders import Contender, memory_matched_window, window_sink_mask
from t2r.models.generation_cache import generation_memory
from tests.helpers.models import ARCHS, VOCAB, random_ids, tiny_source

# --- window_sink_mask ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("length, window, sinks", [
    (1, 1, 0), (7, 1, 0), (7, 1, 2), (9, 3, 0), (9, 3, 2), (12, 5, 4), (6, 2, 10), (6, 6, 0), (5, 8, 1),
])
def test_window_sink_mask_matches_brute_force(length, window, sinks):
    mask = window_sink_mask(length, window, sinks, torch.float32, "cpu")
    assert mask.shape == (1, 1, length, length) and mask.dtype == torch.float32
    lowest = torch.finfo(torch.float32).min
    for i in range(length):
        for j in range(length):
            visible = j <= i and (i - j < window or j < sinks)
            assert mask[0, 0, i, j].item() == (0.0 if visible else lowest), (i, j)


def test_window_sink_mask_counts_and_dtype():
    # every query sees min(i+1, window + sinks) keys, never more, and the diagonal is always visible
    length, window, sinks = 40, 6, 3
    mask = window_sink_mask(length, window, sinks, torch.bfloat16, "cpu")[0, 0]
    assert mask.dtype == torch.bfloat16
    visible = mask == 0
    assert visible.diagonal().all()
    expected = torch.tensor([min(i + 1, window + sinks) for i in range(length)])
    assert torch.equal(visible.sum(1), expected)
    assert (mask[~visible] == torch.finfo(torch.bfloat16).min).all()


# --- a window that covers the whole sequence is the full model --------------------------------------------------

@pytest.mark.parametrize("arch", ARCHS)
def test_window_covering_sequence_equals_full_model(arch):
    # Mistral's own sliding window is 16 in tiny_source: keep T <= 16 here (longer rows are tested below)
    model = tiny_source(arch)
    ids = random_ids(2, 16)
    full = Contender("full", model).logits(ids)
    for window, sinks in [(16, 0), (100, 0), (16, 4), (100, 100)]:
        windowed = Contender("w", model, window=window, sinks=sinks).logits(ids)
        assert windowed.dtype == torch.float32 and windowed.shape == (2, 16, VOCAB)
        torch.testing.assert_close(windowed, full, atol=1e-6, rtol=0)


def test_mistral_custom_mask_replaces_its_own_sliding_window():
    """A 4D mask is used as given: Mistral's config.sliding_window (16) is not applied on top of it.

    So past T = 16, a window >= T equals Mistral *without* a sliding window (and not Mistral as configured),
    while a window of exactly 16 (no sinks) reproduces Mistral's own sliding window (same `i - j < W` rule).
    """
    T = 40
    ids = random_ids(2, T)
    mistral = tiny_source("mistral")
    assert mistral.config.sliding_window == 16
    unlimited = tiny_source("mistral", sliding_window=None)  # same seed: same weights
    full = Contender("full", mistral).logits(ids)
    full_unlimited = Contender("full", unlimited).logits(ids)
    assert not torch.allclose(full, full_unlimited, atol=1e-3)  # the sliding window matters at T=40

    torch.testing.assert_close(Contender("w", mistral, window=T).logits(ids), full_unlimited, atol=1e-6, rtol=0)
    torch.testing.assert_close(Contender("w", mistral, window=16).logits(ids), full, atol=1e-6, rtol=0)


# --- a window shorter than the sequence ------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("window, sinks", [(5, 0), (5, 3), (1, 2), (8, 1)])
def test_short_window_changes_exactly_the_positions_past_window_plus_sinks(arch, window, sinks):
    # query i misses some key iff the hidden range [sinks, i - window] is non-empty, i.e. iff i >= window + sinks
    # (window + sinks <= 16, so Mistral's own sliding window never hides anything at those early positions)
    model = tiny_source(arch)
    T = 24
    ids = random_ids(2, T, seed=1)
    full = Contender("full", model).logits(ids)
    windowed = Contender("w", model, window=window, sinks=sinks).logits(ids)
    cut = window + sinks
    torch.testing.assert_close(windowed[:, :cut], full[:, :cut], atol=1e-6, rtol=0)
    per_position = (windowed - full).abs().amax(dim=(0, 2))  # [T]
    assert (per_position[cut:] > 1e-4).all(), per_position


@pytest.mark.parametrize("arch", ARCHS)
def test_window_mask_same_under_eager_attention_and_in_bf16(arch):
    # the additive mask means the same to the eager and SDPA attention paths, and in a bf16 model
    ids = random_ids(2, 24, seed=3)
    sdpa = tiny_source(arch)
    eager = tiny_source(arch)
    eager.set_attn_implementation("eager")
    assert (sdpa.config._attn_implementation, eager.config._attn_implementation) == ("sdpa", "eager")
    reference = Contender("sdpa", sdpa, window=5, sinks=2).logits(ids)
    torch.testing.assert_close(Contender("eager", eager, window=5, sinks=2).logits(ids), reference,
                               atol=1e-5, rtol=0)
    bf16 = Contender("bf16", tiny_source(arch).to(torch.bfloat16), window=5, sinks=2).logits(ids)
    assert bf16.dtype == torch.float32  # logits come back in fp32
    # bf16 keeps ~3 digits: the tolerance follows the logits' scale (Gemma's reach ~16, Llama's ~1)
    torch.testing.assert_close(bf16, reference, atol=5e-2 * max(1.0, reference.abs().max().item()), rtol=0)


# --- which tokens the last query can see ------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("window, sinks", [(6, 3), (4, 0), (1, 1)])
def test_one_layer_last_position_sees_only_sinks_and_window(arch, window, sinks):
    """With one layer, the last query's logits depend only on the tokens it attends to: the `sinks` first and
    the `window` last. Tokens at positions sinks .. T-window-1 are invisible; any other token matters."""
    T = 20
    model = tiny_source(arch, num_hidden_layers=1)
    contender = Contender("w", model, window=window, sinks=sinks)
    ids = random_ids(1, T, seed=2)
    last = contender.logits(ids)[0, -1]
    hidden = range(sinks, T - window)
    changed = ids.clone()
    changed[0, list(hidden)] = (changed[0, list(hidden)] - 3 + 1) % (VOCAB - 3) + 3  # every hidden token differs
    assert len(hidden) > 0 and (changed != ids).sum() == len(hidden)
    torch.testing.assert_close(contender.logits(changed)[0, -1], last, atol=1e-6, rtol=0)

    for position in [*range(sinks), *range(T - window, T)]:  # each sink and each window token is visible
        one = ids.clone()
        one[0, position] = 3 if ids[0, position] != 3 else 4
        assert (contender.logits(one)[0, -1] - last).abs().max() > 1e-4, position


def test_deeper_model_last_position_does_depend_on_hidden_tokens():
    # why the test above needs one layer: with 3 layers, the window tokens saw the hidden ones in earlier layers
    T, window, sinks = 20, 6, 3
    model = tiny_source("llama")
    contender = Contender("w", model, window=window, sinks=sinks)
    ids = random_ids(1, T, seed=2)
    changed = ids.clone()
    changed[0, T - window - 1] = 3 if ids[0, T - window - 1] != 3 else 4  # hidden from the last query directly
    assert (contender.logits(changed)[0, -1] - contender.logits(ids)[0, -1]).abs().max() > 1e-4


# --- Contender's checks -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("target", ["gsa", "gla", "fox"])
def test_contender_refuses_window_on_converted_model(target):
    converted = t2r.convert(tiny_source("llama"), target)
    with pytest.raises(ValueError, match="softmax model"):
        Contender("w", converted, window=8)
    Contender("converted", converted)  # without a window it is fine


def test_contender_window_on_partly_converted_model_is_refused():
    converted = t2r.convert(tiny_source("llama"), "gsa", layers=[1])
    assert converted.config.t2r_mixers == ["softmax", "gsa", "softmax"]
    with pytest.raises(ValueError, match="softmax model"):
        Contender("w", converted, window=8, sinks=2)


@pytest.mark.parametrize("window, sinks", [(0, 0), (-1, 4), (4, -1)])
def test_contender_rejects_bad_window(window, sinks):
    with pytest.raises(ValueError, match="window >= 1 and sinks >= 0"):
        Contender("w", tiny_source("llama"), window=window, sinks=sinks)


# --- memory_matched_window --------------------------------------------------------------------------------------

@pytest.mark.parametrize("target, layers", [("gsa", None), ("gla", None), ("retnet", None), ("gsa", [0])])
@pytest.mark.parametrize("element_size", [2, 4])
@pytest.mark.parametrize("sinks", [0, 4])
def test_memory_matched_window_is_the_largest_window_that_fits(target, layers, element_size, sinks):
    source = tiny_source("llama")
    converted = t2r.convert(source, target, layers=layers)
    length = 256
    fixed, per_token = generation_memory(converted.config, element_size)
    source_per_token = generation_memory(source.config, element_size)[1]
    assert fixed > 0 and source_per_token > 0
    budget = fixed + per_token * length  # the converted model's cache after `length` tokens, in bytes
    if layers is None:
        assert per_token == 0  # all-recurrent: nothing grows
    else:
        assert per_token > 0   # softmax layers left: the budget grows with the length
    window = memory_matched_window(converted.config, source.config, length, sinks, element_size)
    assert isinstance(window, int) and window >= 1
    assert (window + sinks) * source_per_token <= budget
    assert (window + 1 + sinks) * source_per_token > budget


def test_memory_matched_window_grows_with_length_when_softmax_layers_remain():
    source = tiny_source("llama")
    converted = t2r.convert(source, "gla", layers=[0])
    short = memory_matched_window(converted.config, source.config, 128, 4, 2)
    long = memory_matched_window(converted.config, source.config, 1024, 4, 2)
    assert long > short
    all_recurrent = t2r.convert(source, "gla")
    assert (memory_matched_window(all_recurrent.config, source.config, 128, 4, 2)
            == memory_matched_window(all_recurrent.config, source.config, 1024, 4, 2))


def test_memory_matched_window_is_at_least_one():
    # more sinks than the whole budget holds: the window is clamped to one token, not zero or negative
    source = tiny_source("llama")
    converted = t2r.convert(source, "gla")
    fixed = generation_memory(converted.config, 2)[0]
    tokens = fixed // generation_memory(source.config, 2)[1]
    assert memory_matched_window(converted.config, source.config, 64, tokens + 10, 2) == 1


def test_memory_matched_window_is_none_for_fox():
    # FoX keeps a growing KV cache in every layer (fixed state 0): no window of the same memory exists
    source = tiny_source("llama")
    fox = t2r.convert(source, "fox")
    assert generation_memory(fox.config, 2)[0] == 0
    assert memory_matched_window(fox.config, source.config, 256, 4, 2) is None
