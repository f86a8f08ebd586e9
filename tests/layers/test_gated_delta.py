"""The gdn layer (t2r/layers/gated_delta.py): its short convolution against a step loop, q/k normalisation,
the starting gates and convolution, decode with window + sinks + convolution, packing."""

import math

import pytest
import torch

import t2r
from t2r.layers import gated_delta
from t2r.layers.base import decay_for_lookback
from t2r.layers.short_conv import causal_conv, causal_conv_reference
from tests.helpers.models import tiny_source, windowed


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("with_cache", [False, True])
@pytest.mark.parametrize("width", [2, 4])
def test_causal_conv_matches_the_step_loop(dtype, packed, with_cache, width):
    """Forward and backward; packed: an empty document and documents shorter than the kernel."""
    torch.manual_seed(0)
    cu = torch.tensor([0, 2, 2, 9, 10, 17]) if packed else None
    batch, length, channels = (1, 17, 6) if packed else (3, 11, 6)
    n = len(cu) - 1 if packed else batch
    x = torch.randn(batch, length, channels, dtype=dtype, requires_grad=True)
    w = torch.randn(channels, width, dtype=dtype, requires_grad=True)
    cache = torch.randn(n, width - 1, channels, requires_grad=True) if with_cache else None
    y, new_cache = causal_conv(x, w, cache, cu)
    assert y.dtype == dtype and new_cache.shape == (n, width - 1, channels)
    inputs = [x, w] + ([cache] if with_cache else [])
    exact = [t.detach().double().requires_grad_() for t in inputs]  # the reference in float64
    y_ref, cache_ref = causal_conv_reference(exact[0], exact[1], exact[2] if with_cache else None, cu)

    def close(got, want):  # bf16: rounding of the inputs' products and of the sums over time
        scale = 1e-5 if dtype == torch.float32 else 1e-2 * want.abs().max().item()
        torch.testing.assert_close(got.double(), want, rtol=1e-5 if dtype == torch.float32 else 1e-2, atol=scale)

    close(y, y_ref)
    close(new_cache, cache_ref)
    dy, dc = torch.randn_like(y_ref), torch.randn_like(cache_ref)
    grads = torch.autograd.grad((y * dy.to(dtype)).sum() + (new_cache * dc.to(new_cache.dtype)).sum(), inputs)
    grads_ref = torch.autograd.grad((y_ref * dy).sum() + (cache_ref * dc).sum(), exact)
    for got, want in zip(grads, grads_ref, strict=True):
        close(got, want)


def test_causal_conv_cache_continues_a_sequence():
    torch.manual_seed(1)
    x, w = torch.randn(2, 9, 5), torch.randn(5, 4)
    whole, _ = causal_conv(x, w)
    first, cache = causal_conv(x[:, :2], w)  # shorter than the kernel: the cache keeps zeros from the start
    rest = [first]
    for t in range(2, 9):
        y, cache = causal_conv(x[:, t:t + 1], w, cache)
        rest.append(y)
    torch.testing.assert_close(torch.cat(rest, 1), whole)


def captured_op_inputs(model, ids, monkeypatch, **kwargs):
    calls = []
    op = gated_delta.gated_delta_rule

    def spy(q, k, v, g, beta, **kw):
        calls.append({"q": q, "k": k, "g": g, "beta": beta})
        return op(q, k, v, g, beta, **kw)

    monkeypatch.setattr(gated_delta, "gated_delta_rule", spy)
    with torch.no_grad():
        model(ids, **kwargs)
    return calls


def test_q_and_k_reach_the_op_with_unit_length_per_head(monkeypatch):
    model = t2r.convert(tiny_source("qwen3"), "gdn")
    ids = torch.randint(3, 97, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding: those keys are zero (they write nothing)
    calls = captured_op_inputs(model, ids, monkeypatch, attention_mask=mask)
    assert len(calls) == model.config.num_hidden_layers
    for call in calls:
        q_norm, k_norm = call["q"].norm(dim=-1), call["k"].norm(dim=-1)
        torch.testing.assert_close(q_norm[0], torch.ones_like(q_norm[0]))
        torch.testing.assert_close(k_norm[0], torch.ones_like(k_norm[0]))
        torch.testing.assert_close(k_norm[1, 3:], torch.ones_like(k_norm[1, 3:]))
        assert k_norm[1, :3].abs().max() == 0 and q_norm[1, :3].abs().max() == 0


def test_a_uniform_scale_of_q_and_k_changes_nothing():
    """Only the directions of q and k count: scaling their projections leaves the model as it was."""
    model = t2r.convert(tiny_source("llama"), "gdn")
    ids = torch.randint(3, 97, (1, 12))
    with torch.no_grad():
        before = model(ids).logits
        for layer in model.converted_layers().values():
            layer.q_proj.weight.mul_(3.0)
            layer.k_proj.weight.mul_(0.2)
        torch.testing.assert_close(model(ids).logits, before, rtol=1e-4, atol=1e-5)


def test_the_convolution_starts_as_the_identity():
    source = tiny_source("mistral")
    with_conv, without = t2r.convert(source, "gdn"), t2r.convert(source, "gdn", conv_size=0)
    for layer in with_conv.converted_layers().values():
        expected = torch.zeros_like(layer.conv.weight)
        expected[:, -1] = 1
        assert torch.equal(layer.conv.weight, expected)
    assert not any(hasattr(layer, "conv") for layer in without.converted_layers().values())
    ids = torch.randint(3, 97, (2, 15))
    with torch.no_grad():
        torch.testing.assert_close(with_conv(ids).logits, without(ids).logits, rtol=1e-5, atol=1e-6)
        layer = with_conv.model.layers[0].self_attn
        layer.conv.weight[:, 0] = 0.5  # a trained convolution reads earlier tokens
        assert not torch.allclose(with_conv(ids).logits, without(ids).logits, atol=1e-4)


def test_the_output_gate_starts_at_one():
    source = tiny_source("llama")
    gated, plain = t2r.convert(source, "gdn", output_gate=True), t2r.convert(source, "gdn")
    ids = torch.randint(3, 97, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(gated(ids).logits, plain(ids).logits)
        gated.model.layers[1].self_attn.output_gate.up.normal_()
        assert not torch.allclose(gated(ids).logits, plain(ids).logits, atol=1e-4)


def test_gates_start_at_retnet_decays_and_half_writes():
    model = t2r.convert(tiny_source("llama", num_attention_heads=8, num_key_value_heads=4), "gdn")
    x = torch.randn(2, 5, 64)
    for layer in model.converted_layers().values():
        g, beta = layer.gates(x)
        expected = torch.tensor([1 - 2 ** (-5 - h) for h in range(4)])
        torch.testing.assert_close(g.exp(), expected.expand_as(g), rtol=0, atol=1e-7)
        torch.testing.assert_close(beta, torch.full_like(beta, 0.5))


def test_teacher_lookback_sets_the_decays():
    source = tiny_source("llama")  # 4 query heads, 2 kv heads
    lookback = torch.tensor([[4.0, 12.0, 100.0, 300.0]] * 3)
    model = t2r.convert(source, "gdn", lookback=lookback)
    g, _ = model.model.layers[0].self_attn.gates(torch.randn(1, 2, 64))
    expected = decay_for_lookback(torch.tensor([8.0, 200.0])).float()
    torch.testing.assert_close(g[0, 0].exp(), expected, rtol=0, atol=1e-6)
    assert math.isclose(expected[0].item(), 8 / 9, rel_tol=1e-6)


def test_inverse_softplus_is_accurate_for_tiny_and_large_values():
    y = torch.tensor([1e-12, 2.0 ** -30, 0.03, 1.0, 25.0, 80.0], dtype=torch.float64)
    torch.testing.assert_close(torch.nn.functional.softplus(gated_delta.inverse_softplus(y)), y, rtol=1e-12, atol=0)


@pytest.mark.parametrize("options", [{"window": 4, "sinks": 2}, {"window": 3, "sinks": 0}, {}],
                         ids=["window4-sinks2", "window3", "no-window"])
def test_prefill_then_decode_with_a_trained_convolution_equals_forward(options):
    """Random gates, convolution, output gate and window gain; single-token steps across the window's edge."""
    model = windowed("qwen2", "gdn", seed=3, output_gate=True, **options) if options else \
        windowed("qwen2", "gdn", seed=3, output_gate=True, window=0, sinks=0)
    ids = torch.randint(3, 97, (2, 19))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # as generate() makes them: padding does not count
    with torch.no_grad():
        full = model(ids, attention_mask=mask, position_ids=positions, use_cache=False).logits
        for split in (4, 5, 9):  # the prompt holds the padding, as in generate() (decode steps carry no mask)
            out = model(ids[:, :split], attention_mask=mask[:, :split], position_ids=positions[:, :split],
                        use_cache=True)
            pieces, cache = [out.logits], out.past_key_values
            for t in range(split, 19):
                out = model(ids[:, t:t + 1], attention_mask=mask[:, :t + 1], position_ids=positions[:, t:t + 1],
                            past_key_values=cache, use_cache=True)
                pieces.append(out.logits)
            got = torch.cat(pieces, 1)
            torch.testing.assert_close(got[0], full[0], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(got[1, 4:], full[1, 4:], rtol=1e-4, atol=1e-4)


def test_left_padding_with_a_trained_convolution_equals_the_unpadded_row():
    model = windowed("llama", "gdn", seed=5, window=0, sinks=0)
    row = torch.randint(3, 97, (1, 8))
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), row], 1)
    mask = torch.cat([torch.zeros(1, 3), torch.ones(1, 8)], 1).long()
    with torch.no_grad():
        alone = model(row).logits
        together = model(padded, attention_mask=mask).logits[:, 3:]
    torch.testing.assert_close(together, alone, rtol=1e-4, atol=1e-4)


def test_packed_documents_with_a_trained_convolution_equal_separate_runs():
    model = windowed("qwen2", "gdn", seed=11, window=0, sinks=0)
    a, b, c = torch.randint(3, 97, (1, 9)), torch.randint(3, 97, (1, 2)), torch.randint(3, 97, (1, 6))
    cu = torch.tensor([0, 9, 11, 17], dtype=torch.int32)
    positions = torch.cat([torch.arange(9), torch.arange(2), torch.arange(6)])[None]
    with torch.no_grad():
        together = model(torch.cat([a, b, c], 1), position_ids=positions, cu_seq_lens_q=cu, cu_seq_lens_k=cu).logits
        separate = torch.cat([model(x).logits for x in (a, b, c)], 1)
    torch.testing.assert_close(together, separate, rtol=1e-4, atol=1e-4)


def test_conv_size_is_checked():
    with pytest.raises(ValueError, match="conv_size must be 0"):
        t2r.convert(tiny_source("llama"), "gdn", conv_size=1)
    with pytest.raises(ValueError, match="conv_size must be 0"):
        t2r.convert(tiny_source("llama"), "gdn", conv_size=-2)
