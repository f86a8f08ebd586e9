import pytest

from t2r.eval.settings import EvalSettings


@pytest.mark.parametrize("changes, message", [
    (dict(ppl_rows=0), "ppl_rows must be an integer >= 1, got 0"),
    (dict(limit=0), "limit must be an integer >= 1, got 0"),
    (dict(sinks=-1), "sinks must be an integer >= 0, got -1"),
    (dict(windows=[64, 0]), "windows must be an integer >= 1, got 0"),
    (dict(passkey_depths=[0.5, 1.5]), "passkey_depths must be a number <= 1, got 1.5"),
    (dict(passkey_depths=[float("nan")]), "passkey_depths must be a finite number, got nan"),
    (dict(bench_decode="graph"), "bench_decode='graph': choose eager or static"),
    (dict(dtype="float8"), "dtype='float8' is not one of auto, "),
    (dict(ppl_length=1), "ppl_length must be an integer >= 2, got 1"),  # before: a matplotlib message after scoring
    (dict(passkey_depths=[]), "passkey_depths is an empty list, which the passkey suite needs values of"),  # before:
    (dict(suites=["mqar"], mqar_pairs=[]), "mqar_pairs is an empty list, which the mqar suite"),  # ZeroDivisionError
])
def test_settings_refuse_values_out_of_their_declared_bounds(changes, message):
    with pytest.raises(ValueError, match="^" + message.replace("[", r"\[").replace("(", r"\(")):
        EvalSettings(**changes)


def test_unset_optional_limits_pass():
    assert EvalSettings(limit=None, lm_eval_limit=None).limit is None


def test_an_empty_list_of_a_suite_left_out_passes():
    assert EvalSettings(suites=["ppl"], passkey_depths=[]).passkey_depths == []
