from t2r.words import counted, token_unit


def test_counted_says_one_without_a_plural():
    assert [counted(1, "micro-batch"), counted(2, "micro-batch"), counted(1, "prompt"), counted(1200, "step"),
            counted(4, "process")] == ["1 micro-batch", "2 micro-batches", "1 prompt", "1,200 steps", "4 processes"]


def test_token_units_keep_tick_labels_plain():
    assert [token_unit(n) for n in (5_000, 20_480, 5_000_000, 2e8, 3e10)] == [
        (1.0, ""), (1e3, "K"), (1e3, "K"), (1e6, "M"), (1e9, "B")]
