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
])
def test_settings_refuse_values_out_of_their_declared_bounds(changes, message):
    with pytest.raises(ValueError, match="^" + message.replace("[", r"\[").replace("(", r"\(")):
        EvalSettings(**changes)


def test_unset_optional_limits_pass():
    assert EvalSettings(limit=None, lm_eval_limit=None).limit is None
