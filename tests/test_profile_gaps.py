"""The profile's idle-gap reading (`benchmarks/profile_distill.py`): where the compute stream waited."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
from profile_distill import idle_lines, stream_gaps  # noqa: E402

MS = 1_000_000


def test_gaps_are_found_between_busy_spans_longest_first():
    kernels = [(0, 2 * MS, "a"), (1 * MS, 3 * MS, "b"), (4 * MS, 5 * MS, "c"), (5 * MS, 6 * MS, "d"),
               (9 * MS, 10 * MS, "e")]
    assert stream_gaps(kernels, MS // 2) == [(3 * MS, "d", "e"), (1 * MS, "b", "c")]
    assert stream_gaps(kernels, 2 * MS) == [(3 * MS, "d", "e")]


def test_a_kernel_inside_a_longer_one_does_not_end_the_span():
    kernels = [(0, 10 * MS, "long"), (2 * MS, 3 * MS, "inside"), (11 * MS, 12 * MS, "next")]
    assert stream_gaps(kernels, MS // 2) == [(1 * MS, "long", "next")]


def test_the_busiest_stream_is_read():
    streams = {7: [(0, 1 * MS, "nccl"), (50 * MS, 51 * MS, "nccl")],
               3: [(0, 10 * MS, "mm"), (12 * MS, 40 * MS, "mm2")]}
    text = "\n".join(idle_lines(streams, wall=40.0))
    assert "stream 3, of 2) sat idle 2 ms of 40 ms in 1 gaps" in text
    assert "| 2.0 | `mm` | `mm2` |" in text
    assert idle_lines({}, wall=1.0) == []


def test_named_ranges_are_not_counted_as_work():
    from profile_distill import annotation

    assert annotation(True, "cpu_op") and annotation(False, "gpu_user_annotation")
    assert not annotation(False, "kernel") and not annotation(False, "")
