"""The one grammar of a `layers` spec (`t2r.convert.layer_spec`): what conversion reads is what recipes accept."""

import random

import pytest

from t2r.convert.layer_spec import auto_softmax_count, check_layer_spec, compact_ranges, parse_layers


@pytest.mark.parametrize("spec, expected", [
    (None, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]),
    ("0-3,8,-1", [0, 1, 2, 3, 8, 9]),
    (" 2 - 4 , 7 ,", [2, 3, 4, 7]),
    ("5,5,1-2", [1, 2, 5]),
    ([0, -1, 3], [0, 3, 9]),
    ((4,), [4]),
])
def test_parse_layers(spec, expected):
    assert parse_layers(spec, 10) == expected


@pytest.mark.parametrize("spec, message", [
    ("10", "out of range for a model with 10 layers"),
    ([-11], "out of range"),
    ([], "selects no layer"),
    ("0-2,x", "is not a layer list like '0-11,15,-1' or 'auto:N'"),
    ("", "is not a layer list"),
    ("1,,2", "is not a layer list"),
    ("-3-5", "is not a layer list"),
    ("auto:2", "ranked on sample text first: use t2r.convert.calibrated_convert"),
])
def test_parse_layers_refuses_with_the_reason(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_layers(spec, 10)


def test_auto_counts():
    assert [auto_softmax_count(s) for s in ("auto:3", " auto:0 ", "0-3", None, [1], "auto:x", "auto:-1")] == \
        [3, 0, None, None, None, None, None]


@pytest.mark.parametrize("spec", ["0-3,8,-1", " 2 - 4 , 7 ,", "auto:3", " auto:0", "12"])
def test_what_conversion_reads_recipes_accept(spec):
    check_layer_spec(spec)
    assert auto_softmax_count(spec) is not None or parse_layers(spec, 16)


@pytest.mark.parametrize("spec", ["", "x", "0-", "1,,2", "auto:two", "auto:", "0..3", "-3-5"])
def test_what_conversion_refuses_recipes_refuse(spec):
    with pytest.raises(ValueError, match="is not a layer list"):
        check_layer_spec(spec)
    with pytest.raises(ValueError):
        parse_layers(spec, 16)


def test_compact_ranges_reads_back():
    rng = random.Random(0)
    for _ in range(50):
        indices = sorted(rng.sample(range(40), rng.randrange(1, 40)))
        assert parse_layers(compact_ranges(indices), 40) == indices
    assert compact_ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
