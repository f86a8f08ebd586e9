"""Constant-memory generation: prefill + decode equals one forward; batched left padding is exact."""

import pytest
import torch

import t2r
from t2r.layers.state import GatedKVLayer, RecurrentStateLayer
from tests.helpers.models import greedy, small, tiny_source

TOL = dict(rtol=1e-4, atol=1e-4)  # fp32: chunkwise prefill vs recurrent steps differ only by rounding


def converted(arch, target, **kw):
    """A converted tiny model whose new gate parameters are drawn at random: at their deliberate
    init FoX's forget gates are ~0 (bias 8), so a gate the cache dropped or mangled would not show."""
    model = t2r.convert(tiny_source(arch), target, **small(target), **kw)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            reused = ("q_proj", "k_proj", "v_proj", "o_proj")
            if ".self_attn." in name and not name.split(".self_attn.")[1].startswith(reused):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return model


@pytest.mark.parametrize("split", [1, 7, 13])
def test_prefill_then_decode_equals_full_forward(arch, target, split):
    model = converted(arch, target)
    ids = torch.randint(3, 97, (2, 20))
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        out = model(ids[:, :split], use_cache=True)
        pieces, cache = [out.logits], out.past_key_values
        for t in range(split, 20, 3):  # decode in steps of 3, then 1, to cover multi-token continuation
            out = model(ids[:, t:t + 3], past_key_values=cache, use_cache=True)
            pieces.append(out.logits)
    torch.testing.assert_close(torch.cat(pieces, 1), full, **TOL)


def test_hybrid_prefill_then_decode_equals_full_forward(arch):
    model = converted(arch, "gsa", layers=[1])
    ids = torch.randint(3, 97, (1, 15))
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        out = model(ids[:, :9], use_cache=True)
        steps = [out.logits]
        for t in range(9, 15):
            out = model(ids[:, t:t + 1], past_key_values=out.past_key_values, use_cache=True)
            steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, **TOL)


def test_recurrent_state_does_not_grow_with_length():
    model = converted("llama", "gsa")
    with torch.no_grad():
        cache = model(torch.randint(3, 97, (2, 5)), use_cache=True).past_key_values
        sizes = [s.numel() for layer in cache.layers for s in layer.recurrent_states.values()]
        cache = model(torch.randint(3, 97, (2, 40)), past_key_values=cache, use_cache=True).past_key_values
    assert all(isinstance(layer, RecurrentStateLayer) for layer in cache.layers)
    assert [s.numel() for layer in cache.layers for s in layer.recurrent_states.values()] == sizes
    assert cache.get_seq_length() == 45
    # GSA keeps K~ [B,H,K,M] and V~ [B,H,M,V]: 2 * 2*2*16*8 floats per layer, whatever the length
    assert sizes == [2 * 2 * 16 * 8] * 6


def test_fox_cache_keeps_keys_values_and_gates():
    model = converted("llama", "fox")
    with torch.no_grad():
        cache = model(torch.randint(3, 97, (2, 6)), use_cache=True).past_key_values
    layer = cache.layers[0]
    assert isinstance(layer, GatedKVLayer)
    assert layer.keys.shape == (2, 2, 6, 16) and layer.gates.shape == (2, 4, 6)


def test_left_padded_batch_generates_as_single_sequences(arch, target):
    model = converted(arch, target)
    torch.manual_seed(1)
    a, b = torch.randint(3, 97, (1, 9)), torch.randint(3, 97, (1, 5))
    batch = torch.cat([a, torch.cat([torch.zeros(1, 4, dtype=torch.long), b], 1)])
    mask = torch.cat([torch.ones(1, 9), torch.cat([torch.zeros(1, 4), torch.ones(1, 5)], 1)]).long()
    together = greedy(model, batch, mask)
    assert torch.equal(together[0, 9:], greedy(model, a)[0, 9:])
    assert torch.equal(together[1, 9:], greedy(model, b)[0, 5:])


def test_generate_with_sampling_and_return_dict():
    model = converted("qwen2", "gsa")
    torch.manual_seed(0)
    out = model.generate(torch.randint(3, 97, (2, 6)), max_new_tokens=5, do_sample=True, top_k=10,
                         num_return_sequences=2, return_dict_in_generate=True, pad_token_id=0)
    assert out.sequences.shape == (4, 11)
    assert isinstance(out.past_key_values, t2r.T2RCache)


def test_generate_matches_a_manual_greedy_loop():
    model = converted("llama", "gla")
    ids = torch.randint(3, 97, (1, 7))
    expected = ids
    with torch.no_grad():
        for _ in range(6):
            next_token = model(expected).logits[:, -1].argmax(-1, keepdim=True)
            expected = torch.cat([expected, next_token], 1)
    assert torch.equal(greedy(model, ids, n=6), expected)


def test_reported_cache_memory_matches_the_cache(target):
    from t2r.models.generation_cache import generation_memory

    model = converted("llama", target, layers=[0, 2])
    with torch.no_grad():
        caches = [model(torch.randint(3, 97, (1, n)), use_cache=True).past_key_values for n in (5, 12)]

    def nbytes(cache):
        total = 0
        for layer in cache.layers:
            tensors = [getattr(layer, name, None) for name in ("keys", "values", "gates")]
            tensors += list(getattr(layer, "recurrent_states", {}).values())
            total += sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))
        return total

    fixed, per_token = generation_memory(model.config, element_size=4)
    assert nbytes(caches[0]) == fixed + 5 * per_token
    assert nbytes(caches[1]) == fixed + 12 * per_token
    report = t2r.conversion_report(tiny_source("llama"), model)
    assert (report.state_bytes, report.cache_bytes_per_token) == (fixed, per_token)
    assert report.source_cache_bytes_per_token == 3 * 2 * 2 * 16 * 4  # layers x (K, V) x kv heads x head dim x fp32


def test_beam_search_with_the_recurrent_cache_equals_recomputing(target):
    """Beam search reorders the cached states (reorder_cache); recomputing from scratch needs no cache."""
    model = converted("mistral", target)
    ids = torch.randint(3, 97, (2, 6))
    kwargs = dict(max_new_tokens=6, num_beams=3, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(ids, **kwargs), model.generate(ids, use_cache=False, **kwargs))


def test_cache_memory_refuses_a_mixer_it_does_not_know():
    """An unknown mixer is an error, never silently counted as per-token K/V."""
    from types import SimpleNamespace

    from t2r.models.generation_cache import generation_memory

    config = SimpleNamespace(num_attention_heads=4, num_key_value_heads=2, head_dim=16, hidden_size=64,
                             num_hidden_layers=2, t2r_mixers=["gsa_v2", "softmax"], t2r_options={})
    with pytest.raises(ValueError, match="unknown mixer 'gsa_v2'"):
        generation_memory(config)
