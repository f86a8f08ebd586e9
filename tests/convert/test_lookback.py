"""init="teacher": the source's look-back per head, and the gate decays it sets."""

import json

import pytest
import torch

import t2r
from t2r.cli import main
from t2r.convert.lookback import attention_lookback
from t2r.layers.base import decay_for_lookback
from tests.helpers.data import write_words
from tests.helpers.models import save_tiny_source, tiny_source

IDS = torch.randint(3, 97, (2, 40), generator=torch.Generator().manual_seed(1))


def test_uniform_attention_looks_back_half_way():
    """With q = 0 every causal key gets the same weight: past the sinks, query i looks back (i - 4) / 2 tokens
    on average; the statistic is the mean of that over queries 8..39."""
    source = tiny_source("llama")
    with torch.no_grad():
        for layer in source.model.layers:
            layer.self_attn.q_proj.weight.zero_()
    lookback = attention_lookback(source, IDS, sinks=4)
    expected = torch.tensor([(i - 4) / 2 for i in range(8, 40)]).mean()
    torch.testing.assert_close(lookback, expected.expand(3, 4), atol=1e-4, rtol=0)
    assert source.config._attn_implementation == "sdpa"  # put back after the eager measurement


def test_decay_has_the_measured_mean_lookback():
    d = torch.tensor([1.0, 7.5, 300.0, 1e6])
    gamma = decay_for_lookback(d)
    torch.testing.assert_close(gamma / (1 - gamma), d.clamp(max=4096).double())


def test_gla_and_fox_gates_start_at_the_decays():
    source = tiny_source("llama")
    lookback = torch.tensor([[2.0, 6.0, 50.0, 70.0]] * 3)
    gla = t2r.convert(source, "gla", lookback=lookback).model.layers[1].self_attn
    decay = gla.gate(torch.zeros(1, 1, 64)).exp()[0, 0]  # the low-rank part starts at zero: bias alone
    torch.testing.assert_close(decay, decay_for_lookback(torch.tensor([4.0, 60.0]))[:, None].float().expand(2, 16))
    fox = t2r.convert(source, "fox", lookback=lookback).model.layers[2].self_attn
    torch.testing.assert_close(fox.forget_gate(torch.zeros(1, 1, 64)).exp()[0, 0],
                               decay_for_lookback(lookback[2]).float())
    for target in ("gsa", "retnet"):
        with pytest.raises(ValueError, match=f"{target} has no learned forget-gate decay"):
            t2r.convert(source, target, lookback=lookback)


def test_command_line_and_recipe_entries(tmp_path):
    save_tiny_source(tmp_path / "src", tokenizer="words")
    args = ["convert", "--model", str(tmp_path / "src"), "--to", "fox", "--device", "cpu", "--data",
            str(write_words(tmp_path / "text.jsonl")), "--calibration-rows", "2", "--calibration-length", "32"]
    assert main([*args, "--out", str(tmp_path / "default")]) == 0
    assert main([*args, "--init", "teacher", "--out", str(tmp_path / "teacher")]) == 0
    from safetensors.torch import load_file

    bias = "model.layers.0.self_attn.forget_gate.bias"
    default, teacher = (load_file(tmp_path / d / "model.safetensors")[bias] for d in ("default", "teacher"))
    assert torch.all(default == 8.0) and torch.all(teacher < 8.0)  # a 32-token text: shorter memories
    assert json.loads((tmp_path / "teacher" / "config.json").read_text())["t2r_mixers"] == ["fox"] * 3

    from t2r.train.recipe import RecipeError
    from tests.helpers.recipes import make_recipe

    assert make_recipe("convert.target=gla", "convert.options={}", "convert.init=teacher").convert.init == "teacher"
    with pytest.raises(RecipeError, match="'gsa' does not have"):
        make_recipe("convert.init=teacher")
