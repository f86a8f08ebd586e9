from t2r.words import counted


def test_counted_says_one_without_a_plural():
    assert [counted(1, "micro-batch"), counted(2, "micro-batch"), counted(1, "prompt"), counted(1200, "step"),
            counted(4, "process")] == ["1 micro-batch", "2 micro-batches", "1 prompt", "1,200 steps", "4 processes"]
