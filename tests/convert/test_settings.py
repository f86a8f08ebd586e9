"""`ConvertSettings`: one declaration of the conversion settings, shared by recipes, `t2r convert` /
`t2r rank-layers` and `calibrated_convert`; mixer options checked by their own declarations."""

import inspect
import subprocess
import sys
from dataclasses import fields

import pytest

from t2r.convert.settings import CONVERT_DEFAULTS, ConvertSettings
from t2r.train.fields import RecipeError
from t2r.train.recipe import ConvertSection
from tests.helpers.recipes import make_recipe


def test_the_recipe_section_is_convert_settings():
    assert ConvertSection is ConvertSettings
    convert = make_recipe("convert.rank_by=halo").convert
    assert isinstance(convert, ConvertSettings) and convert.rank_by == "halo"
    resolved = make_recipe().to_dict()["convert"]
    assert set(resolved) == {"target", "layers", "kept_window", "options", "rank_by", "rank_sweep", "init",
                             "calibration_rows", "calibration_length"}  # not `data`: a recipe calibrates on its data
    assert make_recipe("convert.calibration_rows=8").convert.calibration_rows == 8
    with pytest.raises(RecipeError, match="convert.data: a command-line setting, not a recipe field"):
        make_recipe("convert.data=text.jsonl")
    with pytest.raises(RecipeError, match="convert.calibration_length: .*<= 1048576"):
        make_recipe("convert.calibration_length=1e30")
    with pytest.raises(RecipeError, match="kept_window=64 bounds the layers left softmax, but layers converts every"):
        make_recipe("convert.kept_window=64")


def test_a_recipe_calibrates_as_its_convert_section_says(tmp_path, source_dir, corpus, monkeypatch):
    """`convert.calibration_rows` / `calibration_length` reach `calibrated_convert` (the length capped at the
    recipe's `data.seq_len`), as `--calibration-rows` / `--calibration-length` do for `t2r convert`."""
    from t2r.train import model_setup
    from tests.helpers.recipes import recipe

    asked = {}

    class Enough(Exception):
        """Nothing past the calibration's settings is needed."""

    def spy(*args, **kwargs):
        asked.update(rows=kwargs["rows"], length=kwargs["length"])
        raise Enough

    monkeypatch.setattr(model_setup, "calibrated_convert", spy)
    for overrides, expected in [({}, (4, 32)), ({"convert.calibration_rows": 2, "convert.calibration_length": 16,
                                                 "data.seq_len": 64}, (2, 16))]:
        with pytest.raises(Enough):
            model_setup.build_model(recipe(tmp_path, source_dir, corpus, **overrides))
        assert (asked["rows"], asked["length"]) == expected


def test_calibrated_convert_takes_its_defaults_from_the_settings():
    from t2r.convert.calibration import calibrated_convert, resolve_layers

    defaults = inspect.signature(calibrated_convert).parameters
    assert {name: defaults[name].default for name in ("layers", "init", "rank_by", "rank_sweep", "rows", "length")} \
        == {"layers": None, "init": CONVERT_DEFAULTS["init"], "rank_by": CONVERT_DEFAULTS["rank_by"],
            "rank_sweep": CONVERT_DEFAULTS["rank_sweep"], "rows": CONVERT_DEFAULTS["calibration_rows"],
            "length": CONVERT_DEFAULTS["calibration_length"]}
    assert inspect.signature(resolve_layers).parameters["rows"].default == CONVERT_DEFAULTS["calibration_rows"]
    with pytest.raises(ValueError, match="calibration_rows must be a positive integer, got 0"):
        calibrated_convert(None, None, "gla", rows=0)  # refused before anything is measured


@pytest.mark.parametrize("kwargs, message", [
    (dict(target="mamba"), "target='mamba' is not one of gsa, gla, retnet, fox, gdn"),
    (dict(target="gsa", rank_by="ratio"), "rank_by='ratio' is not one of kl"),
    (dict(target="gsa", calibration_length=10**30), "calibration_length must be an integer <= "),
])
def test_bad_settings_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ConvertSettings(**kwargs)


@pytest.mark.parametrize("name, value, message", [
    ("gate_logit_normalizer", 0, "gate_logit_normalizer must be a positive (number|integer), got 0"),
    ("num_slots", 10**30, "num_slots must be an integer <= 65536"),
    ("window", 10**30, "window must be an integer <= "),
])
def test_mixer_options_are_checked_by_their_declaration(name, value, message):
    """The same bounds in a recipe and through the Python API (`ConvertSettings.mixer_options`)."""
    with pytest.raises(RecipeError, match=f"convert.options: {message}"):
        make_recipe(f"convert.options={{{name}: {value:.0e}}}")
    with pytest.raises(ValueError, match=message):
        ConvertSettings(target="gsa", options={name: value}).mixer_options()


def test_fox_gate_bias_and_nan_in_recipes():
    with pytest.raises(ValueError, match="fox_gate_bias must be a finite number, got nan"):
        ConvertSettings(target="fox", options={"fox_gate_bias": float("nan")}).mixer_options()
    with pytest.raises(RecipeError, match="convert.options.fox_gate_bias: expected a number, got 'nan'"):
        make_recipe("convert.target=fox", "convert.options={}", "convert.options.fox_gate_bias=nan")
    with pytest.raises(RecipeError, match="convert.options: fox_gate_bias must be a number <= 100"):
        make_recipe("convert.target=fox", "convert.options={}", "convert.options.fox_gate_bias=1e30")


def test_every_field_has_help_and_the_module_needs_no_torch():
    assert all(f.metadata["help"] for f in fields(ConvertSettings))
    script = "import sys; sys.argv = ['t2r']; import t2r.convert.settings; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr
