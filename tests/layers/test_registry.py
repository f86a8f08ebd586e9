"""The mixer registry: a mixer defined and registered here, and nowhere else, goes through every stage (its
per-target facts, such as init="teacher", on its spec and class); the README's tables follow the registries."""

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM
from transformers import initialization as init

import t2r
from t2r.cli import build_parser
from t2r.layers import MIXERS, MixerSpec, RecurrentMixer, get_mixer, register_mixer, unregister_mixer
from t2r.layers.base import ConvertedAttention, decay_for_lookback
from t2r.layers.options import MixerOptions, option
from t2r.models.generation_cache import generation_memory
from tests.helpers.models import tiny_source

README = Path(__file__).resolve().parents[2] / "README.md"


@dataclass
class DecayOptions(MixerOptions):
    feature_map: str = "relu"
    output_norm: bool = True
    initial_decay: float = option(0.9, "decay: starting value of the learned per-head decay")

    def validate(self) -> None:
        super().validate()
        if not 0 < self.initial_decay < 1:
            raise ValueError(f"initial_decay must be in (0, 1), got {self.initial_decay}")


class LearnedDecayAttention(RecurrentMixer):
    """S_t = lambda_h S_{t-1} + k_t v_t^T, o_t = q_t S_t, with one learned decay per kv head: written as the
    plainest loop, so the test checks the plumbing, not an op."""

    target = "decay"

    def __init__(self, attention, config, layer_idx, options):
        super().__init__(attention, config, layer_idx, options)
        self.decay_logit = nn.Parameter(torch.empty(self.num_kv_heads))

    def init_parameters(self, std: float) -> None:
        decay = torch.tensor(self.options.initial_decay)
        init.constant_(self.decay_logit, float(torch.log(decay / (1 - decay))))

    @torch.no_grad()
    def init_from_lookback(self, lookback: torch.Tensor) -> None:
        """init="teacher": each kv head's decay from its query heads' look-back."""
        decay = decay_for_lookback(self.group_lookback(lookback))
        self.decay_logit.copy_(torch.log(decay / (1 - decay)).to(self.decay_logit))

    def recur(self, hidden_states, q, k, v, state, output_final_state, cu_seqlens):
        assert cu_seqlens is None
        batch, length, q_heads, dim = q.shape
        q = q.view(batch, length, self.num_kv_heads, q_heads // self.num_kv_heads, dim).float()
        decay = torch.sigmoid(self.decay_logit)[None, :, None, None]
        s = state if state is not None else q.new_zeros(batch, self.num_kv_heads, dim, v.shape[-1])
        outputs = []
        for t in range(length):
            s = decay * s + k[:, t, :, :, None].float() * v[:, t, :, None, :].float()
            outputs.append(torch.einsum("bhgk,bhkv->bhgv", q[:, t], s).reshape(batch, q_heads, -1))
        return torch.stack(outputs, 1), (s if output_final_state else None)


@pytest.fixture
def decay_mixer():
    spec = register_mixer(MixerSpec("decay", DecayOptions, LearnedDecayAttention, constant_memory=True,
                                    summary="learned per-head decay (test only)", teacher_init=True))
    yield spec
    unregister_mixer("decay")


def test_a_mixer_registered_outside_t2r_converts_generates_saves_and_reloads(decay_mixer, tmp_path):
    source = tiny_source("llama")
    model = t2r.convert(source, "decay", layers=[0, 2], initial_decay=0.8).eval()
    assert model.config.t2r_mixers == ["decay", "softmax", "decay"]
    assert model.config.layer_types[0] == "linear_attention"
    report = t2r.conversion_report(source, model)
    assert report.added_parameters == 2 * 2  # one decay per kv head in two layers
    assert torch.sigmoid(model.model.layers[0].self_attn.decay_logit).allclose(torch.tensor(0.8))

    ids = torch.randint(3, 97, (2, 11))
    with torch.no_grad():
        full = model(ids).logits
        prefill = model(ids[:, :7], use_cache=True)
        cache = prefill.past_key_values
        steps = [prefill.logits]
        for t in range(7, 11):
            out = model(ids[:, t:t + 1], past_key_values=cache, use_cache=True)
            cache, steps = out.past_key_values, steps + [out.logits]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    assert cache.get_state(0).shape == (2, 2, 16, 16)  # the layer's own fixed state, in the cache
    fixed, per_token = generation_memory(model.config)
    assert fixed == LearnedDecayAttention.state_bytes(model.config.mixer_options(0), 4, 2, 16, 2)[0] * 2
    assert per_token == 2 * 2 * 16 * 2  # the one softmax layer's K/V

    generated = model.generate(ids, max_new_tokens=5, do_sample=False)
    assert generated.shape == (2, 16)

    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert reloaded.config.t2r_options["decay"]["initial_decay"] == 0.8
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, full)


def test_a_registered_mixer_with_learned_decays_takes_init_teacher_everywhere(decay_mixer):
    from tests.helpers.recipes import make_recipe

    lookback = torch.tensor([[3.0, 5.0, 9.0, 11.0]] * 3)
    model = t2r.convert(tiny_source("llama"), "decay", lookback=lookback)
    torch.testing.assert_close(torch.sigmoid(model.model.layers[1].self_attn.decay_logit),
                               decay_for_lookback(torch.tensor([4.0, 10.0])).float())
    assert make_recipe("convert.target=decay", "convert.options={}", "convert.init=teacher").convert.init == "teacher"
    convert_help = build_parser()._subparsers._group_actions[0].choices["convert"].format_help()
    assert "(gla, fox, gdn, decay)" in " ".join(convert_help.split())  # --init teacher's targets
    no_decay = r"retnet has no learned forget-gate decay .*\(supported: gla, fox, gdn, decay\)"
    with pytest.raises(ValueError, match=no_decay):
        t2r.convert(tiny_source("llama"), "retnet", lookback=lookback)


def test_teacher_init_is_set_for_the_layers_that_take_a_lookback(decay_mixer):
    for name, spec in MIXERS.items():
        assert spec.teacher_init == (spec.layer_class.init_from_lookback is not ConvertedAttention.init_from_lookback)


def test_a_registered_mixer_gets_its_convert_flags(decay_mixer):
    args = build_parser().parse_args(["convert", "--to", "decay", "--out", "x", "--initial-decay", "0.7"])
    assert (args.target, args.initial_decay) == ("decay", 0.7)
    help_text = " ".join(build_parser()._subparsers._group_actions[0].choices["convert"].format_help().split())
    assert "--initial-decay INITIAL_DECAY decay: starting value of the learned per-head decay (decay; default 0.9)" \
        in help_text


def test_an_unregistered_mixer_is_an_error_everywhere(decay_mixer, tmp_path):
    model = t2r.convert(tiny_source("llama"), "decay")
    model.save_pretrained(tmp_path)
    unregister_mixer("decay")
    try:
        with pytest.raises(ValueError, match=r"unknown mixer\(s\) \['decay'\].*register_mixer"):
            AutoModelForCausalLM.from_pretrained(tmp_path)
        with pytest.raises(ValueError, match="unknown mixer 'decay'"):
            generation_memory(model.config)
        with pytest.raises(ValueError, match="unknown mixer 'decay'"):
            t2r.convert(tiny_source("llama"), "decay")
    finally:
        register_mixer(decay_mixer)
    with pytest.raises(ValueError, match="already registered"):
        register_mixer(decay_mixer)


def test_adds_parameters_matches_what_each_built_in_layer_adds():
    source = tiny_source("llama")
    for name, spec in MIXERS.items():
        added = t2r.conversion_report(source, t2r.convert(source, name)).added_parameters
        assert spec.adds_parameters == (added > 0), name


def test_saved_options_of_other_targets_are_dropped_on_load():
    """Configs saved before per-target options held every target's fields under each target."""
    legacy = {"feature_map": "relu", "rope": False, "output_norm": True, "num_slots": 64,
              "gate_logit_normalizer": 16.0, "gate_low_rank_dim": 4, "fox_gate_bias": 8.0}
    assert get_mixer("gla").options_from_config(legacy).to_dict() == {
        "feature_map": "relu", "rope": False, "output_norm": True, "gate_logit_normalizer": 16.0,
        "gate_low_rank_dim": 4, "window": 0, "sinks": 0, "denominator": False}  # saved before the denominator
    with pytest.raises(ValueError, match="no option"):
        get_mixer("gla").options_from_config({**legacy, "slots": 3})


def test_readme_tables_follow_the_registries():
    text = README.read_text()
    targets = re.findall(r"^\| `(\w+)` \|", text.split("| target | mixer |", 1)[1].split("\n\n", 1)[0], re.M)
    assert targets == list(MIXERS)
    sentence = re.search(r"t2r takes a pretrained ([^.]*?) checkpoint", text).group(1)
    names = [re.sub(r"[^a-z0-9]", "", n.lower()) for n in re.split(r",| or ", sentence) if n.strip()]
    assert names == [key.replace("_", "") for key in t2r.ARCHITECTURES]
    assert all(f"`t2r_{name}`" in text for name in t2r.ARCHITECTURES)
