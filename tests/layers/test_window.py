"""Converted layers with window + sinks: exact for short sequences, prefill + decode == forward, constant
memory, left padding, packing, hybrids, save/load, LoRA, gradients."""

import pytest
import torch
from transformers import AutoModelForCausalLM

import t2r
from t2r.layers import MIXERS
from t2r.layers.state import WindowedStateLayer
from tests.helpers.models import WINDOW, greedy, small, tiny_source, windowed

FIXED_STATE = [name for name, spec in MIXERS.items() if spec.constant_memory]


@pytest.fixture(params=FIXED_STATE)
def fixed_target(request):
    return request.param


def test_up_to_window_plus_sinks_tokens_the_converted_model_is_its_source(arch, fixed_target):
    source = tiny_source(arch)
    model = windowed(arch, fixed_target)
    ids = torch.randint(3, 97, (2, WINDOW["window"] + WINDOW["sinks"]))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, source(ids).logits, rtol=1e-4, atol=1e-4)
        longer = torch.randint(3, 97, (2, 16))
        assert not torch.allclose(model(longer).logits, source(longer).logits, atol=1e-3)  # the state reads


def test_a_fresh_conversion_is_sliding_window_attention_of_the_source():
    """The gain starts at 0: past the window the layer is the source's softmax over window + sinks."""
    source = tiny_source("llama")
    model = t2r.convert(tiny_source("llama"), "gla", window=6, sinks=2)
    ids = torch.randint(3, 97, (1, 20))
    with torch.no_grad():
        source.config._attn_implementation = "eager"
        expected = source(ids, attention_mask=torch.ones_like(ids)).logits
    assert all(layer.window.gain.abs().sum() == 0 for layer in model.converted_layers().values())
    with torch.no_grad():
        different = (model(ids).logits - expected).abs().amax(-1)
    assert different[0, :8].max() < 1e-4 and different[0, 8:].max() > 1e-3


@pytest.mark.parametrize("split", [1, 6, 11])
def test_prefill_then_decode_equals_full_forward(arch, fixed_target, split):
    model = windowed(arch, fixed_target)
    ids = torch.randint(3, 97, (2, 24))
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        out = model(ids[:, :split], use_cache=True)
        pieces, cache = [out.logits], out.past_key_values
        for t in range(split, 24, 3):  # continue in chunks of 3, then single tokens
            step = 3 if t < 15 else 1
            for u in range(t, min(t + 3, 24), step):
                out = model(ids[:, u:u + step], past_key_values=cache, use_cache=True)
                pieces.append(out.logits)
    torch.testing.assert_close(torch.cat(pieces, 1), full, rtol=1e-4, atol=1e-4)


def test_generation_memory_is_constant_and_reported(fixed_target):
    from t2r.models.generation_cache import generation_memory

    model = windowed("llama", fixed_target, layers=[0, 2])
    with torch.no_grad():
        caches = [model(torch.randint(3, 97, (1, n)), use_cache=True).past_key_values for n in (9, 40)]

    def nbytes(cache):
        total = 0
        for layer in cache.layers:
            assert isinstance(layer, WindowedStateLayer) or not hasattr(layer, "recent")
            tensors = list(getattr(layer, "recurrent_states", {}).values())
            tensors += [t for buffers in (getattr(layer, "recent", None), getattr(layer, "sink_slots", None))
                        if buffers for t in buffers.values()]
            tensors += [getattr(layer, name, None) for name in ("keys", "values")]
            # storage bytes, not view bytes: a ring that kept a slice of the prompt's tensors would show
            total += sum(t.untyped_storage().nbytes() for t in tensors if isinstance(t, torch.Tensor))
        return total

    windowed_layers = [i for i, layer in enumerate(caches[1].layers) if isinstance(layer, WindowedStateLayer)]
    assert windowed_layers == [0, 2]
    # layer 1 stays softmax: its K/V grows per token; the windowed layers' state, ring and sinks do not
    fixed, per_token = generation_memory(model.config, element_size=4)
    assert fixed > 0 and per_token > 0
    assert nbytes(caches[0]) == fixed + 9 * per_token
    assert nbytes(caches[1]) == fixed + 40 * per_token
    ring = caches[1].layers[0].recent
    assert ring["k_src"].shape[1] == WINDOW["window"] and caches[1].layers[0].sink_slots["filled"].all()


def test_left_padded_batch_generates_as_single_sequences(arch, fixed_target):
    model = windowed(arch, fixed_target)
    torch.manual_seed(1)
    a, b = torch.randint(3, 97, (1, 11)), torch.randint(3, 97, (1, 6))
    batch = torch.cat([a, torch.cat([torch.zeros(1, 5, dtype=torch.long), b], 1)])
    mask = torch.cat([torch.ones(1, 11), torch.cat([torch.zeros(1, 5), torch.ones(1, 6)], 1)]).long()
    together = greedy(model, batch, mask, n=10)
    assert torch.equal(together[0, 11:], greedy(model, a, n=10)[0, 11:])
    assert torch.equal(together[1, 11:], greedy(model, b, n=10)[0, 6:])


def test_packed_documents_equal_separate_runs(fixed_target):
    model = windowed("qwen2", fixed_target)
    a, b = torch.randint(3, 97, (1, 13)), torch.randint(3, 97, (1, 9))
    position_ids = torch.cat([torch.arange(13), torch.arange(9)])[None]
    cu = torch.tensor([0, 13, 22], dtype=torch.int32)
    with torch.no_grad():
        together = model(torch.cat([a, b], 1), position_ids=position_ids, cu_seq_lens_q=cu, cu_seq_lens_k=cu).logits
        separate = torch.cat([model(a).logits, model(b).logits], 1)
    torch.testing.assert_close(together, separate, rtol=1e-4, atol=1e-4)


def test_hybrid_save_load_round_trip(tmp_path, fixed_target):
    model = windowed("mistral", fixed_target, layers=[0, 2])
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.t2r_options[fixed_target]["window"] == WINDOW["window"]
    ids = torch.randint(3, 97, (2, 17))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_gradients_reach_the_gain_first_then_the_gates(fixed_target):
    """At conversion the gain is 0: it gets a gradient (the state's read-out) while the gates do not yet;
    once it is off zero the gates learn too."""
    model = t2r.convert(tiny_source("llama"), fixed_target, **small(fixed_target), **WINDOW).train()
    ids = torch.randint(3, 97, (2, 20))
    model(ids, labels=ids).loss.backward()
    layer = model.converted_layers()[0]
    assert layer.window.gain.grad.abs().sum() > 0
    gates = [p for name, p in layer.named_parameters() if "gate" in name]
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in gates)
    model.zero_grad()
    with torch.no_grad():
        layer.window.gain.fill_(0.5)
    model(ids, labels=ids).loss.backward()
    assert gates == [] or any(p.grad.abs().sum() > 0 for p in gates)  # (GLA: its zero-started up-projection
    # leaves the down-projection without gradient at first, as without a window)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_lora_trains_adapters_gates_and_the_gain(tmp_path):
    from peft import LoraConfig, get_peft_model

    model = windowed("llama", "gsa")
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                        modules_to_save=["slot_gate", "window"])
    peft_model = get_peft_model(model, config)
    trainable = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    assert any("window" in n for n in trainable) and any("lora_" in n for n in trainable)
    ids = torch.randint(3, 97, (2, 14))
    peft_model(ids, labels=ids).loss.backward()
    assert all(p.grad is not None for n, p in peft_model.named_parameters() if p.requires_grad)


def test_options_are_checked():
    with pytest.raises(ValueError, match="sinks=2 needs a window"):
        t2r.convert(tiny_source("llama"), "gla", sinks=2)
    with pytest.raises(ValueError, match="window must be an integer >= 0"):
        t2r.convert(tiny_source("llama"), "gla", window=-1)
    with pytest.raises(ValueError, match="window"):
        t2r.convert(tiny_source("llama"), "fox", window=8)  # FoX keeps every key: no window option


def test_static_decoding_refuses_a_window():
    from t2r.models.static_decode import check_static_decodable

    with pytest.raises(ValueError, match="window"):
        check_static_decodable(t2r.convert(tiny_source("llama"), "gsa", num_slots=8, window=4))


def test_beam_search_reorders_the_ring_and_sinks(fixed_target):
    model = windowed("mistral", fixed_target)
    ids = torch.randint(3, 97, (2, 9))
    kwargs = dict(max_new_tokens=6, num_beams=3, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(ids, **kwargs), model.generate(ids, use_cache=False, **kwargs))
