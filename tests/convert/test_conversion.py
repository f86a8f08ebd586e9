"""Conversion: every architecture to every target, parameter reuse, hybrids, options and bad inputs."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import t2r
from t2r.layers import get_mixer
from tests.helpers.models import small, tiny_source


def test_converts_every_architecture_to_every_target(arch, target):
    source = tiny_source(arch)
    model = t2r.convert(source, target, **small(target))
    assert model.config.model_type == f"t2r_{arch}"
    assert model.config.t2r_mixers == [target] * 3
    for layer in model.model.layers:
        assert isinstance(layer.self_attn, get_mixer(target).layer_class)
    # every source weight is reused unchanged, under the same name
    converted = model.state_dict()
    for name, tensor in source.state_dict().items():
        assert torch.equal(converted[name], tensor), name
    ids = torch.randint(3, 97, (2, 13))
    logits = model(ids).logits
    assert logits.shape == (2, 13, 97) and torch.isfinite(logits).all()


def test_source_model_is_left_untouched():
    source = tiny_source("llama")
    before = {k: v.clone() for k, v in source.state_dict().items()}
    t2r.convert(source, "gsa")
    assert type(source.model.layers[0].self_attn).__name__ == "LlamaAttention"
    assert all(torch.equal(before[k], v) for k, v in source.state_dict().items())


def test_added_parameters_are_only_the_gates(arch):
    source = tiny_source(arch)
    hidden, kv_heads, heads, head_dim, layers = 64, 2, 4, 16, 3
    expected = {
        "gsa": layers * hidden * kv_heads * 8,                                  # W_alpha
        "gla": layers * (16 * hidden + kv_heads * head_dim * (16 + 1)),         # low-rank gate + bias
        "retnet": 0,
        "fox": layers * heads * (hidden + 1),                                   # per-head forget gate
    }
    for target, added in expected.items():
        report = t2r.conversion_report(source, t2r.convert(source, target, **small(target)))
        assert report.added_parameters == added, target
        assert report.source_parameters == sum(p.numel() for p in source.parameters())


def test_fox_starts_close_to_the_source_model(arch):
    source = tiny_source(arch)
    ids = torch.randint(3, 97, (2, 14))  # within Mistral's window of 16: FoX layers see the whole past
    with torch.no_grad():
        expected = source(ids).logits
        diff = (t2r.convert(source, "fox")(ids).logits - expected).abs().max()
        closed = t2r.convert(source, "fox", fox_gate_bias=30.0)(ids).logits  # log f ~ -1e-13: no forgetting
    # forget gate starts at sigmoid(8): a bias below 14 * 3.4e-4 on every attention logit
    assert diff < 1e-2 * max(1.0, expected.abs().max().item())
    torch.testing.assert_close(closed, expected, atol=1e-5, rtol=1e-5)  # otherwise exactly the source


def test_gla_starts_as_retention(arch):
    source = tiny_source(arch)
    ids = torch.randint(3, 97, (2, 20))
    with torch.no_grad():
        gla = t2r.convert(source, "gla", gate_logit_normalizer=16)(ids).logits
        retnet = t2r.convert(source, "retnet")(ids).logits
    torch.testing.assert_close(gla, retnet, rtol=1e-4, atol=1e-4)


def test_hybrid_keeps_selected_layers_softmax():
    source = tiny_source("llama")
    model = t2r.convert(source, "gsa", layers="0,2")
    assert model.config.t2r_mixers == ["gsa", "softmax", "gsa"]
    assert model.config.layer_types == ["linear_attention", "full_attention", "linear_attention"]
    assert type(model.model.layers[1].self_attn).__name__ == "LlamaAttention"
    assert t2r.convert(source, "gla", layers=[-1]).config.t2r_mixers == ["softmax", "softmax", "gla"]


def test_mistral_softmax_layers_keep_the_sliding_window():
    model = t2r.convert(tiny_source("mistral"), "gla", layers=[0])
    assert model.config.layer_types == ["linear_attention", "sliding_attention", "sliding_attention"]
    assert model.config.sliding_window == 16


def test_qwen2_keeps_qkv_biases():
    model = t2r.convert(tiny_source("qwen2"), "gsa")
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.bias is not None and attn.k_proj.bias is not None and attn.o_proj.bias is None


def test_qwen3_converted_layers_reuse_the_source_qk_norms(target):
    source = tiny_source("qwen3")
    model = t2r.convert(source, target, **small(target))
    attn = model.model.layers[0].self_attn
    assert type(attn.q_norm).__name__ == "Qwen3RMSNorm" and type(attn.k_norm).__name__ == "Qwen3RMSNorm"
    assert dict(model.named_parameters())["model.layers.0.self_attn.q_norm.weight"] is attn.q_norm.weight
    assert torch.equal(attn.k_norm.weight, source.model.layers[0].self_attn.k_norm.weight)
    ids = torch.randint(3, 97, (1, 9))
    with torch.no_grad():  # the norms are applied: changing their weights changes the output
        before = model(ids).logits
        # not a uniform factor: gdn L2-normalises q per head, so only the direction of q matters
        attn.q_norm.weight.mul_(torch.linspace(0.5, 2.0, attn.q_norm.weight.numel()))
        assert not torch.allclose(model(ids).logits, before)


def test_fox_with_rope_starts_as_qwen3_even_in_bf16():
    source = tiny_source("qwen3").to(torch.bfloat16)
    ids = torch.randint(3, 97, (2, 14))
    with torch.no_grad():
        diff = (t2r.convert(source, "fox")(ids).logits.float() - source(ids).logits.float()).abs().max()
    assert diff < 5e-2


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_sliding_layers_are_read_from_the_source_config(arch):
    source = tiny_source(arch, use_sliding_window=True, sliding_window=8, max_window_layers=1)
    assert source.config.layer_types == ["full_attention", "sliding_attention", "sliding_attention"]
    model = t2r.convert(source, "gla", layers=[1])
    assert model.config.layer_types == ["full_attention", "linear_attention", "sliding_attention"]
    # past the window the softmax layers still slide: FoX on the full layer 0 starts as the source
    ids = torch.randint(3, 97, (1, 20))
    with torch.no_grad():
        diff = (t2r.convert(source, "fox", layers=[0])(ids).logits - source(ids).logits).abs().max()
    assert diff < 1e-2


def test_source_adapters_name_the_source_classes():
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3Model

    adapter = t2r.ARCHITECTURES["qwen3"]
    assert adapter.source_classes == (Qwen3Config, Qwen3Model, Qwen3ForCausalLM)
    assert adapter.config_class.model_type == "t2r_qwen3"
    assert all(issubclass(ours, theirs) for ours, theirs in zip(adapter.classes, adapter.source_classes))


def test_options_are_recorded_in_the_config():
    model = t2r.convert(tiny_source("llama"), "gsa", num_slots=4, feature_map="relu", rope=False)
    options = model.config.t2r_options["gsa"]
    assert (options["num_slots"], options["feature_map"], options["rope"]) == (4, "relu", False)
    assert model.model.layers[0].self_attn.slot_gate.out_features == 2 * 4


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(target="mamba"), "unknown mixer 'mamba': choose one of gsa, gla, retnet, fox"),
        (dict(target="gsa", num_slots=0), "num_slots must be a positive integer"),
        (dict(target="gsa", num_slots=-3), "num_slots must be a positive integer"),
        (dict(target="gla", feature_map="tanh"), "feature_map"),
        (dict(target="gla", slots=4), r"\['slots'\] do not apply to gla \(slots is no option\)"),
        (dict(target="gla", num_slots=4), "do not apply to gla .num_slots is an option of gsa"),
        (dict(target="fox", output_norm="yes"), "output_norm must be a bool, got 'yes'"),
        (dict(target="gla", layers=[5]), "out of range"),
        (dict(target="gla", layers=[]), "selects no layer"),
    ],
)
def test_bad_options_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        t2r.convert(tiny_source("llama"), **kwargs)


def test_unsupported_architecture_is_named():
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    with pytest.raises(ValueError, match="unsupported architecture 'gpt2'.*llama, mistral, qwen2"):
        t2r.convert(gpt2, "gsa")


def test_head_sizes_that_do_not_divide_are_rejected():
    with pytest.raises(ValueError, match="not a multiple of num_key_value_heads"):
        t2r.convert(tiny_source("llama", num_attention_heads=4, num_key_value_heads=3, head_dim=16), "gla")


def test_converting_twice_is_refused():
    model = t2r.convert(tiny_source("llama"), "gla")
    with pytest.raises(ValueError, match="already converted"):
        t2r.convert(model, "gsa")


def test_every_target_honours_output_norm(target):
    """The option goes through the shared layer contract, FoX included (it used to bypass it)."""
    source, ids = tiny_source("llama"), torch.randint(3, 97, (1, 9))
    default = t2r.convert(source, target, **small(target))
    flipped = t2r.convert(source, target, output_norm=not default.config.t2r_options[target]["output_norm"],
                          **small(target))
    with torch.no_grad():
        assert not torch.allclose(default(ids).logits, flipped(ids).logits, atol=1e-4)


def test_convert_without_copy_takes_the_source_tensors():
    source = tiny_source("llama")
    torch.manual_seed(0)  # the same random start for the new gates of both
    shared = t2r.convert(source, "gsa", copy=False, num_slots=4)
    torch.manual_seed(0)
    copied = t2r.convert(source, "gsa", num_slots=4)
    pointers = {p.data_ptr() for p in source.parameters()}
    reused = [p for n, p in shared.named_parameters() if "slot_gate" not in n]
    assert reused and all(p.data_ptr() in pointers for p in reused)  # the gates are the only new memory
    assert not any(p.data_ptr() in pointers for p in copied.parameters())
    ids = torch.randint(3, 97, (1, 9))
    with torch.no_grad():
        torch.testing.assert_close(shared(ids).logits, copied(ids).logits)


def _attention_outputs(model, ids):
    """Per layer, what o_proj reads `[B, T, HQ * D]` and the values `[B, T, H * D]`."""
    seen = {}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        attention = layer.self_attn
        hooks.append(attention.o_proj.register_forward_pre_hook(
            lambda m, args, i=i: seen.__setitem__(("o", i), args[0])))
        hooks.append(attention.v_proj.register_forward_hook(lambda m, args, out, i=i: seen.__setitem__(("v", i), out)))
    with torch.no_grad():
        model(ids)
    for hook in hooks:
        hook.remove()
    return seen


@pytest.mark.parametrize("target", ["gla", "retnet"])
def test_linear_attention_reads_out_a_mean_of_values_on_the_sources_scale(target):
    """At conversion a GLA / RetNet layer outputs, as the softmax it replaces does, a weighted mean of the values
    it has seen (Katharopoulos et al. 2020, eq. 5): each channel within the range of its kv head's past values,
    and the RMS within 2x of the source attention's. The read-out used before, a weightless RMS norm of the
    unnormalised sum, wrote unit-RMS vectors at every token: 11-20x the source's here, 1-30x on SmolLM2, where
    the GLA and RetNet students then did not learn (issue 31)."""
    source, ids = tiny_source("llama"), torch.randint(3, 97, (2, 40))
    model = t2r.convert(source, target)
    ours, theirs = _attention_outputs(model, ids), _attention_outputs(source, ids)
    for i in range(source.config.num_hidden_layers):
        o, v = ours[("o", i)].unflatten(-1, (4, 16)), ours[("v", i)].unflatten(-1, (2, 16))
        v = v.repeat_interleave(2, dim=2)  # the kv head each query head reads
        low, high = v.cummin(dim=1).values, v.cummax(dim=1).values
        assert (o >= low - 1e-5).all() and (o <= high + 1e-5).all(), f"layer {i}"
        ratio = (o.pow(2).mean() / theirs[("o", i)].pow(2).mean()).sqrt().item()
        assert 0.5 < ratio < 2, f"layer {i}: output RMS {ratio:.2f}x the source attention's"


def test_models_saved_before_the_denominator_load_with_their_read_out(tmp_path):
    """A GLA saved when the read-out was a weightless RMS norm (its config has no `denominator`) loads with that
    read-out; a new conversion gets the denominator."""
    import json

    from transformers import AutoModelForCausalLM

    source, ids = tiny_source("llama"), torch.randint(3, 97, (1, 11))
    old = t2r.convert(source, "gla", denominator=False, output_norm=True)
    old.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["t2r_options"]["gla"]["denominator"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.t2r_options["gla"]["denominator"] is False
    assert loaded.config.t2r_options["gla"]["output_norm"] is True
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, old(ids).logits, atol=1e-5)
    new = t2r.convert(source, "gla").config.t2r_options["gla"]
    assert (new["denominator"], new["output_norm"]) == (True, False)
