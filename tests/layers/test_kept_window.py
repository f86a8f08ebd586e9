"""Layers with options of their own (`t2r_layer_options`), and `kept_window`: the layers a hybrid keeps softmax
converted too, with a longer window, so that every layer's memory is constant."""

import pytest
import torch
from transformers import AutoModelForCausalLM

import t2r
from t2r.convert import calibrated_convert
from t2r.convert.settings import ConvertSettings
from t2r.layers import MIXERS
from t2r.models.generation_cache import generation_memory
from tests.helpers.models import WINDOW, small, tiny_source, windowed

FIXED_STATE = [name for name, spec in MIXERS.items() if spec.constant_memory]
LONGER = {1: {"window": 9}}


def cache_bytes(cache) -> int:
    tensors = []
    for layer in cache.layers:
        tensors += list(getattr(layer, "recurrent_states", {}).values())
        tensors += [t for buffers in (getattr(layer, "recent", None), getattr(layer, "sink_slots", None))
                    if buffers for t in buffers.values()]
        tensors += [getattr(layer, name, None) for name in ("keys", "values")]
    return sum(t.untyped_storage().nbytes() for t in tensors if isinstance(t, torch.Tensor))


@pytest.mark.parametrize("target", FIXED_STATE)
def test_a_layer_with_its_own_window_decodes_as_it_runs_whole(target):
    model = windowed("llama", target, layer_options=LONGER)
    assert [layer.options.window for layer in model.converted_layers().values()] == [5, 9, 5]
    ids = torch.randint(3, 97, (2, 30))
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        out = model(ids[:, :7], use_cache=True)
        pieces, cache = [out.logits], out.past_key_values
        for t in range(7, 30, 2):
            out = model(ids[:, t:t + 2], past_key_values=cache, use_cache=True)
            pieces.append(out.logits)
    torch.testing.assert_close(torch.cat(pieces, 1), full, rtol=1e-4, atol=1e-4)


def test_generation_memory_counts_each_layers_window_and_stays_constant():
    model = windowed("llama", "gdn", layer_options=LONGER)
    plain = windowed("llama", "gdn")
    with torch.no_grad():
        caches = [model(torch.randint(3, 97, (1, n)), use_cache=True).past_key_values for n in (30, 60)]
    fixed, per_token = generation_memory(model.config, element_size=4)
    plain_fixed = generation_memory(plain.config, element_size=4)[0]
    longer = windowed("llama", "gdn", layer_options={1: {"window": 13}})
    assert per_token == 0 and fixed > plain_fixed
    assert generation_memory(longer.config, element_size=4)[0] - plain_fixed == 2 * (fixed - plain_fixed)  # 8 vs 4
    assert cache_bytes(caches[0]) == cache_bytes(caches[1]) == fixed


def test_layer_options_survive_save_and_load(tmp_path):
    model = windowed("mistral", "gla", layer_options=LONGER)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.t2r_layer_options == {"1": {"window": 9}}
    assert loaded.config.mixer_options(1).window == 9 and loaded.config.mixer_options(0).window == 5
    ids = torch.randint(3, 97, (2, 21))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_kept_window_bounds_the_kept_layers_and_starts_as_the_hybrid_within_it():
    """Layer 1, left softmax by `layers`, becomes gdn with window 9 + 2 sinks: up to 11 tokens it is exactly the
    hybrid's softmax layer (its state reads nothing yet and its gain starts at 0); beyond, its window cuts."""
    source = tiny_source("llama")
    hybrid = t2r.convert(source, "gdn", layers=[0, 2], **WINDOW)
    bounded = calibrated_convert(source, None, "gdn", layers="0,2", kept_window=9, **WINDOW)
    assert bounded.config.t2r_mixers == ["gdn"] * 3
    assert bounded.config.t2r_layer_options == {"1": {"window": 9}}
    short, long = torch.randint(3, 97, (2, 11)), torch.randint(3, 97, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(bounded(short).logits, hybrid(short).logits, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(bounded(long).logits, hybrid(long).logits, atol=1e-3)
    state, per_token = generation_memory(bounded.config)
    assert per_token == 0 and state > generation_memory(hybrid.config)[0]


def test_kept_window_is_refused_where_it_cannot_apply():
    with pytest.raises(ValueError, match="converts every layer.*auto:N"):
        ConvertSettings("gdn", kept_window=64)
    with pytest.raises(ValueError, match="fox has none"):
        ConvertSettings("fox", layers="auto:2", kept_window=64)
    with pytest.raises(ValueError, match="greater than 0|> 0|must be"):
        ConvertSettings("gdn", layers="auto:2", kept_window=0)
    assert ConvertSettings("none", kept_window=64).kept_window == 64  # a baseline recipe converts nothing


def test_layer_options_must_name_converted_layers():
    model = windowed("llama", "gla", layers=[0, 2])
    fields = {**model.config.to_dict(), "t2r_layer_options": {"1": {"window": 9}}}
    with pytest.raises(ValueError, match="layer 1, which is not a converted layer"):
        type(model.config)(**{k: v for k, v in fields.items() if k not in ("model_type", "transformers_version")})
    fields["t2r_layer_options"] = {"0": {"window": 0}}
    with pytest.raises(ValueError, match="window"):
        type(model.config)(**{k: v for k, v in fields.items() if k not in ("model_type", "transformers_version")})


def test_a_recipe_with_kept_window_trains_a_model_of_constant_memory(tmp_path, source_dir, corpus):
    from t2r.train import finetune
    from tests.helpers.recipes import recipe

    r = recipe(tmp_path, source_dir, corpus, **{"convert.target": "gdn", "convert.options": "{window: 4, sinks: 1}",
                                                 "convert.layers": "1", "convert.kept_window": 8,
                                                 "train.max_steps": 2})
    finetune(r)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final")
    assert model.config.t2r_mixers == ["gdn"] * 3
    assert model.config.t2r_layer_options == {"0": {"window": 8}, "2": {"window": 8}}
    assert generation_memory(model.config)[1] == 0


def test_convert_command_takes_kept_window(tmp_path, capsys):
    from t2r.cli import main
    from tests.helpers.models import save_tiny_source

    save_tiny_source(tmp_path / "src", tokenizer="words")
    assert main(["convert", "--model", str(tmp_path / "src"), "--to", "gla", "--layers", "0,2", "--kept-window", "9",
                 "--window", "5", "--sinks", "2", "--device", "cpu", "--out", str(tmp_path / "out")]) == 0
    assert "fixed + 0.0 KiB per token" in capsys.readouterr().out
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert model.config.t2r_layer_options == {"1": {"window": 9}} and model.config.t2r_mixers == ["gla"] * 3
    assert main(["convert", "--model", str(tmp_path / "src"), "--to", "gla", "--kept-window", "9",
                 "--device", "cpu", "--out", str(tmp_path / "all")]) == 2
    assert "converts every layer" in capsys.readouterr().err
    assert "| layers' own options | layer 1: window=9 |" in (tmp_path / "out" / "README.md").read_text()


@pytest.mark.parametrize("target", FIXED_STATE)
def test_the_ring_keeps_one_key_and_the_gates_of_each_token(target):
    """A token waiting in the window to enter the state is kept as what the state will read of it: its gates
    (gdn: decay and write strength per kv head; gla: per key; gsa: per slot; retnet: nothing), not its hidden
    state (hidden_size wide), and its key once, unrotated (rotated again for the softmax, mapped when it enters
    the state): a window costs a few bytes a token beyond the K/V of softmax attention."""
    model = windowed("llama", target, layers=[0])
    heads, dim = model.config.num_key_value_heads, model.config.head_dim
    expected = {"gdn": (heads, 2), "gla": (heads, dim), "gsa": (heads * small("gsa")["num_slots"],), "retnet": None}
    with torch.no_grad():
        ring = model(torch.randint(3, 97, (2, 12)), use_cache=True).past_key_values.layers[0].recent
    assert "hidden" not in ring and "k_rot" not in ring and "k" not in ring  # one copy of each key: k_src
    if expected[target] is None:
        assert "entry" not in ring
    else:
        assert ring["entry"].shape == (2, WINDOW["window"], *expected[target])


def test_a_copied_cache_continues_as_the_original_and_copies_no_model(arch):
    """Re-using a prompt's cache (transformers' `copy.deepcopy(prompt_cache)`): the copy's window ring rotates
    its keys with a copy of the rotary module it holds, not the whole model, and continues as the original."""
    import copy

    model = windowed(arch, "gdn", layer_options=LONGER)
    prompt, more = torch.randint(3, 97, (1, 14)), torch.randint(3, 97, (1, 3))
    with torch.no_grad():
        cache = model(prompt, use_cache=True).past_key_values
        copied = copy.deepcopy(cache)
        assert not any(hasattr(arg, "layers") or hasattr(arg, "lm_head") for arg in copied.rotary_at.args)
        expected = model(more, past_key_values=cache, use_cache=True).logits
        got = model(more, past_key_values=copied, use_cache=True).logits
    assert torch.equal(got, expected)
