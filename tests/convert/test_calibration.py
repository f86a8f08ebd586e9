"""`calibrated_convert`: the one composition of ranking (`auto:N`), look-back (`init="teacher"`) and `convert`,
checked against the three steps run by hand."""

import pytest
import torch

import t2r
from t2r.convert import calibration
from t2r.convert.calibration import calibrated_convert, calibration_rows
from t2r.convert.lookback import attention_lookback
from t2r.convert.sensitivity import rank_layers
from tests.helpers.data import char_tokenizer
from tests.helpers.models import tiny_source

IDS = torch.randint(3, 97, (2, 24), generator=torch.Generator().manual_seed(2))


@pytest.fixture
def fixed_text(monkeypatch):
    """Calibration on IDS (no tokenizer needed); records each request for text."""
    requests = []
    monkeypatch.setattr(calibration, "calibration_rows", lambda *args: requests.append(args[2:]) or IDS)
    return requests


def test_ranks_measures_and_converts_as_the_steps_by_hand(fixed_text, tmp_path):
    source = tiny_source("llama")
    measured = []
    model = calibrated_convert(source, None, "gla", layers="auto:1", init="teacher", rows=2, length=24,
                               ranking_dir=tmp_path, measure=lambda fn: measured.append(fn) or fn(),
                               gate_low_rank_dim=4)
    assert len(measured) == 2 and fixed_text == [(2, 24), (2, 24)]  # the ranking, then the look-back

    converted = rank_layers(source, "gla", IDS, progress=False, gate_low_rank_dim=4).converted_layers(1)
    expected = t2r.convert(source, "gla", layers=converted, lookback=attention_lookback(source, IDS),
                           gate_low_rank_dim=4)
    assert model.config.t2r_mixers == expected.config.t2r_mixers
    assert model.config.t2r_mixers.count("softmax") == 1 and (tmp_path / "ranking.json").is_file()
    assert model.state_dict().keys() == expected.state_dict().keys()
    for name, tensor in expected.state_dict().items():
        if not name.endswith(".gate.down"):  # a random start (the low-rank gate's first factor)
            torch.testing.assert_close(model.state_dict()[name], tensor, msg=name)
    assert not torch.equal(model.model.layers[converted[0]].self_attn.gate.bias,
                           t2r.convert(source, "gla", layers=converted).model.layers[converted[0]].self_attn.gate.bias)


def test_without_auto_or_teacher_it_is_convert(fixed_text):
    source = tiny_source("qwen3")
    model = calibrated_convert(source, None, "fox", layers="0,2", source="somewhere", copy=False, fox_gate_bias=4.0)
    assert fixed_text == []  # nothing measured
    assert model.config.t2r_mixers == ["fox", "softmax", "fox"] and model.config.t2r_source == "somewhere"
    assert model.model.embed_tokens.weight.data_ptr() == source.model.embed_tokens.weight.data_ptr()  # copy=False
    assert torch.all(model.model.layers[0].self_attn.forget_gate.bias == 4.0)
    with pytest.raises(ValueError, match="init='learned': choose default or teacher"):
        calibrated_convert(source, None, "fox", init="learned")
    with pytest.raises(ValueError, match=r"retnet has no learned forget-gate decay .*\(supported: gla, fox, gdn\)"):
        calibrated_convert(source, None, "retnet", init="teacher")
    assert fixed_text == []  # refused before anything was measured


def test_calibration_rows_without_data_are_generated_documents():
    rows = calibration_rows(char_tokenizer(), rows=2, length=64)
    assert rows.shape == (2, 64) and rows.dtype == torch.long
    assert torch.equal(rows, calibration_rows(char_tokenizer(), rows=2, length=64))  # the same text each time
