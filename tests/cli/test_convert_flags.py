"""`t2r convert` / `t2r rank-layers` flags come from `ConvertSettings` and the mixer options classes: defaults in
--help, bad numbers refused as the flags are parsed, and an option added to a mixer is a flag, a recipe field
and a Python API keyword at once."""

from dataclasses import dataclass

import pytest

from t2r.cli import build_parser, main
from t2r.layers import MixerSpec, register_mixer, resolve_options, unregister_mixer
from t2r.layers.options import RetNetOptions, option
from t2r.train.fields import RecipeError
from tests.helpers.recipes import make_recipe


def help_text(capsys, command: str) -> str:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    return " ".join(capsys.readouterr().out.split())


def test_help_shows_each_default_from_the_settings(capsys):
    text = help_text(capsys, "convert")
    for shown in ("(default: 4)", "(default: 512)", "(default: kl)", "(default: convert-one)", "(default: all)",
                  "on the calibration text (gla, fox, gdn)"):
        assert shown in text
    assert "--layers LAYERS" not in help_text(capsys, "rank-layers")
    args = build_parser().parse_args(["convert", "--to", "gdn", "--out", "x"])
    assert (args.calibration_rows, args.init, args.layers, args.num_slots) == (4, "default", None, None)


@pytest.mark.parametrize("flags, message", [
    (["--gate-logit-normalizer", "nan"], "argument --gate-logit-normalizer: gate_logit_normalizer must be a finite"),
    (["--fox-gate-bias", "nan"], "argument --fox-gate-bias: fox_gate_bias must be a finite number, got nan"),
    (["--num-slots", "1e30"], "argument --num-slots: num_slots must be an integer <= 65536, got 1e+30"),
    (["--window", "1e30"], "argument --window: window must be an integer <= 16777216, got 1e+30"),
    (["--calibration-rows", "1e30"], "argument --calibration-rows: calibration_rows must be an integer <= 4096"),
])
def test_absurd_numbers_fail_as_the_flags_are_parsed(flags, message, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["convert", "--to", "gsa", "--out", "x", *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"t2r convert: error: {message}" or message in err[-1]


def test_a_lower_bound_fails_before_anything_loads(tmp_path, capsys):
    assert main(["rank-layers", "--to", "gla", "--out", str(tmp_path), "--model", str(tmp_path / "nowhere"),
                 "--gate-low-rank-dim", "0"]) == 2
    assert "gate_low_rank_dim must be a positive integer, got 0" in capsys.readouterr().err


@dataclass
class ProbeOptions(RetNetOptions):
    probe_gain: float = option(1.0, "probe: a test-only gain", gt=0, max=10)


@pytest.fixture
def probe():
    register_mixer(MixerSpec("probe", ProbeOptions, "t2r.layers.retnet:RetentionAttention", constant_memory=True,
                             summary="test only", adds_parameters=False))
    yield
    unregister_mixer("probe")


def test_an_option_added_to_a_mixer_is_everywhere_at_once(probe, capsys):
    assert "--probe-gain PROBE_GAIN probe: a test-only gain (probe; default 1)" in help_text(capsys, "convert")
    args = build_parser().parse_args(["convert", "--to", "probe", "--out", "x", "--probe-gain", "2.5"])
    assert args.probe_gain == 2.5
    with pytest.raises(SystemExit):
        build_parser().parse_args(["convert", "--to", "probe", "--out", "x", "--probe-gain", "11"])
    assert "probe_gain must be a number <= 10, got 11" in capsys.readouterr().err
    assert make_recipe("convert.target=probe", "convert.options={probe_gain: 3}").convert.options == \
        {"probe_gain": 3.0}
    with pytest.raises(RecipeError, match="convert.options: probe_gain must be a number <= 10"):
        make_recipe("convert.target=probe", "convert.options={probe_gain: 12}")
    assert resolve_options("probe", probe_gain=4.0).probe_gain == 4.0
    with pytest.raises(ValueError, match="probe_gain must be a finite number, got nan"):
        resolve_options("probe", probe_gain=float("nan"))
