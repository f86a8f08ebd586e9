"""The source registry: a source defined and registered here, and nowhere else, goes through every stage;
the converted causal LM builds one base model, the converted one, laid out as the source's."""

import pytest
import torch
from huggingface_hub.dataclasses import strict
from transformers import AutoModelForCausalLM, OlmoConfig, OlmoForCausalLM, OlmoModel

import t2r
from t2r.layers import MIXERS
from t2r.models import ARCHITECTURES, SourceAdapter, get_source, register_source, unregister_source
from t2r.models.configuration import T2RConfigMixin
from t2r.models.modeling import T2RCausalLMMixin, T2RModelMixin
from tests.helpers.models import ARCHS, TINY_SOURCES, TinySource, small, tiny_source

# --- a throwaway source: OLMo (non-parametric layer norms; clip_qkv clamps q, k, v, which t2r does not do) ---

@strict
class T2ROlmoConfig(T2RConfigMixin, OlmoConfig):
    model_type = "t2r_olmo"


class T2ROlmoModel(T2RModelMixin, OlmoModel):
    config: T2ROlmoConfig


class T2ROlmoForCausalLM(T2RCausalLMMixin, OlmoForCausalLM):
    config: T2ROlmoConfig


def olmo_unsupported(config) -> str | None:
    return "clip_qkv clamps q, k and v, which converted layers do not" if config.clip_qkv is not None else None


@pytest.fixture
def olmo():
    adapter = register_source(SourceAdapter("olmo", T2ROlmoConfig, T2ROlmoModel, T2ROlmoForCausalLM,
                                            unsupported=olmo_unsupported))
    TINY_SOURCES["olmo"] = TinySource()  # the source's row of the test table
    yield adapter
    unregister_source("olmo")
    del TINY_SOURCES["olmo"]


@pytest.mark.parametrize("target", list(MIXERS))
def test_a_source_registered_outside_t2r_converts_decodes_saves_and_reloads(olmo, target, tmp_path):
    source = tiny_source("olmo")
    model = t2r.convert(source, target, layers=[0, 2], **small(target)).eval()
    assert type(model) is T2ROlmoForCausalLM and model.config.model_type == "t2r_olmo"
    converted = model.state_dict()
    assert all(torch.equal(converted[name], tensor) for name, tensor in source.state_dict().items())

    ids = torch.randint(3, 97, (2, 11))
    with torch.no_grad():
        full = model(ids).logits
        prefill = model(ids[:, :7], use_cache=True)
        cache, steps = prefill.past_key_values, [prefill.logits]
        for t in range(7, 11):
            out = model(ids[:, t:t + 1], past_key_values=cache, use_cache=True)
            cache, steps = out.past_key_values, steps + [out.logits]
    assert torch.isfinite(full).all()
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-4, rtol=1e-4)

    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(reloaded) is T2ROlmoForCausalLM
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, full)


def test_a_registered_source_starts_as_itself_and_says_what_it_cannot_convert(olmo):
    source = tiny_source("olmo")
    ids = torch.randint(3, 97, (2, 13))
    with torch.no_grad():  # FoX with a closed forget gate is softmax attention: the source, exactly
        torch.testing.assert_close(t2r.convert(source, "fox", fox_gate_bias=30.0)(ids).logits, source(ids).logits,
                                   atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="olmo: clip_qkv clamps q, k and v.*cannot convert this model yet"):
        t2r.convert(tiny_source("olmo", clip_qkv=8.0), "gla")


def test_an_unregistered_source_is_an_error_naming_the_registry(olmo, tmp_path):
    source = tiny_source("olmo")
    t2r.convert(source, "gla").save_pretrained(tmp_path)
    unregister_source("olmo")
    try:
        with pytest.raises(ValueError, match="unknown source architecture 't2r_olmo'.*register_source"):
            AutoModelForCausalLM.from_pretrained(tmp_path)
        with pytest.raises(ValueError, match="unsupported architecture 'olmo'"):
            t2r.convert(source, "gla")
    finally:
        register_source(olmo)
    with pytest.raises(ValueError, match="already registered"):
        register_source(olmo)


def test_a_converted_config_carries_the_source_model_type_with_the_prefix():
    with pytest.raises(ValueError, match="T2ROlmoConfig.model_type is 't2r_olmo'; a converted olmo2 config must be "
                                         "'t2r_olmo2'"):
        register_source(SourceAdapter("olmo2", T2ROlmoConfig, T2ROlmoModel, T2ROlmoForCausalLM))
    assert "olmo2" not in ARCHITECTURES


# --- every registered source ---------------------------------------------------------------------------------

def test_every_source_has_a_row_of_the_test_table():
    assert set(TINY_SOURCES) == set(ARCHITECTURES) == set(ARCHS)


@pytest.mark.parametrize("arch", ARCHS)
def test_the_converted_causal_lm_builds_one_base_model_laid_out_as_the_source(arch, monkeypatch):
    adapter = get_source(arch)
    source_config, source_base, source_causal_lm = adapter.source_classes
    config = tiny_source(arch).config
    source = source_causal_lm(config)
    built = []
    init = source_base.__init__
    monkeypatch.setattr(source_base, "__init__", lambda self, config: built.append(type(self)) or init(self, config))
    model = adapter.causal_lm_class(t2r.t2r_config(config, "gla", layers=[0]))
    assert built == [adapter.model_class]  # the converted base model only; the source's is never built
    assert type(model.model) is adapter.model_class and isinstance(model, source_causal_lm)
    assert set(vars(model)) == set(vars(source))  # what the source's __init__ sets, and nothing else
    children = ([(name, type(child)) for name, child in m.named_children()] for m in (model, source))
    assert next(children)[1:] == next(children)[1:]  # the head (lm_head) as the source's, after the base model
    assert model.vocab_size == source.vocab_size and model.lm_head.weight.shape == source.lm_head.weight.shape
    shapes, source_shapes = ({n: p.shape for n, p in m.named_parameters()} for m in (model, source))
    assert {n: shapes.get(n) for n in source_shapes} == source_shapes  # every source parameter, as it was
    assert all(n.startswith("model.layers.0.self_attn.gate.") for n in set(shapes) - set(source_shapes))
