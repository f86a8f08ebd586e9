"""Plot helpers: tick labels without exponents, series nudged apart."""

from t2r.eval.axes import nudge, plain, spread, tokens_text


def test_tick_labels_are_plain_numbers():
    assert [plain(v) for v in (2000, 26.5, 5, 0.5, 0.004, 2e-5)] == ["2,000", "26.5", "5", "0.5", "0.004", "0.00002"]
    assert [tokens_text(v) for v in (256, 1024, 1536, 32768, 2**20)] == ["256", "1K", "1.5K", "32K", "1M"]


def test_equal_series_are_drawn_apart_and_stay_close():
    xs = [spread([8, 32], i, 4) for i in range(4)]
    ys = [nudge([0.0, 0.0], i, 4) for i in range(4)]
    assert len({x[0] for x in xs}) == 4 and len({y[0] for y in ys}) == 4
    assert max(abs(y[0]) for y in ys) <= 0.02 and all(0.9 < x[0] / 8 < 1.1 for x in xs)
