"""`t2r.settings`: one field helper whose metadata carries help, choices and bounds, and one check of them."""

from dataclasses import dataclass

import pytest

from t2r.settings import check_settings, check_value, defaults, field_meta, setting


@dataclass
class Knobs:
    rate: float = setting(0.5, "a rate", gt=0, max=1)
    count: int = setting(4, "a count", gt=0, max=64)
    floor: int = setting(0, "at least zero", min=0)
    mode: str = setting("a", "a mode", choices=("a", "b", "c"))
    sizes: list = setting([1, 2], "sizes", gt=0)

    def __post_init__(self):
        check_settings(self)


@dataclass
class Derived(Knobs):
    rate: float = 0.25  # redeclared with a plain default: the help and bounds stay


@pytest.mark.parametrize("kwargs, message", [
    (dict(rate=float("nan")), "rate must be a finite number, got nan"),
    (dict(rate=float("inf")), "rate must be a finite number, got inf"),
    (dict(rate=0.0), "rate must be a positive number, got 0"),
    (dict(rate=2.0), "rate must be a number <= 1, got 2"),
    (dict(count=0), "count must be a positive integer, got 0"),
    (dict(count=10**30), "count must be an integer <= 64, got 1e+30"),
    (dict(floor=-1), "floor must be an integer >= 0, got -1"),
    (dict(mode="d"), "mode='d' is not one of a, b, c"),
    (dict(sizes=[1, 0]), "sizes must be a positive integer, got 0"),
])
def test_a_bad_value_is_one_line_naming_the_setting(kwargs, message):
    with pytest.raises(ValueError) as err:
        Knobs(**kwargs)
    assert str(err.value) == message


def test_defaults_and_inherited_metadata():
    assert defaults(Knobs) == {"rate": 0.5, "count": 4, "floor": 0, "mode": "a", "sizes": [1, 2]}
    assert Knobs().sizes is not Knobs().sizes  # a list default is copied per instance
    assert field_meta(Derived, "rate")["help"] == "a rate"
    with pytest.raises(ValueError, match="rate must be a number <= 1"):
        Derived(rate=3.0)
    check_value("anything", None, {"gt": 0})  # an unset optional passes
    with pytest.raises(ValueError, match="init='x': choose default or teacher"):
        check_value("init", "x", {"choices": lambda: ("default", "teacher")})  # choices read when checked
