"""The step loop's garbage collection (`t2r.train.collector`): automatic collection off inside a run of steps,
the set-up's objects frozen, the young generations collected after each step and all every `full_every`."""

import gc
import json

import pytest

from t2r.train.collector import StepCollector


@pytest.fixture
def generations():
    """The generation of each collection Python runs while the test does."""
    seen = []

    def record(phase, info):
        if phase == "start":
            seen.append(info["generation"])

    gc.callbacks.append(record)
    yield seen
    gc.callbacks.remove(record)


def test_inside_a_run_collection_waits_for_the_steps(generations):
    assert gc.isenabled()
    frozen_before = gc.get_freeze_count()
    with StepCollector(full_every=3) as collector:
        assert not gc.isenabled()
        assert gc.get_freeze_count() > frozen_before  # what existed at the start is out of every collection
        for _ in range(20_000):  # far past gen 0's threshold: no automatic collection
            [[]]  # noqa: B018
        assert generations == []
        for step in (1, 2, 3, 4):
            collector.step_done(step)
        assert generations == [1, 1, 2, 1]
    assert gc.isenabled() and gc.get_freeze_count() == frozen_before


def test_inactive_or_already_disabled_collection_is_left_as_it_was(generations):
    with StepCollector(active=False) as collector:
        assert gc.isenabled()
        collector.step_done(100)
    assert generations == [] and gc.isenabled()
    gc.disable()
    try:
        with StepCollector():
            pass
        assert not gc.isenabled()  # a caller that had turned it off keeps it off
    finally:
        gc.enable()


def test_a_run_collects_at_its_steps_and_restores_collection(tmp_path, source_dir, corpus):
    """A 6-step run collects after each step (young generations) and nothing more inside the loop; automatic
    collection is back on after it, also when a run of steps ends by an error."""
    from t2r.train import finetune
    from tests.helpers.recipes import recipe

    enabled = []
    finetune(recipe(tmp_path, source_dir, corpus, **{"data.held_out": 0}),
             callbacks=[lambda metrics: enabled.append(gc.isenabled())])
    assert enabled == [False] * 6 and gc.isenabled()
    rows = [json.loads(r) for r in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len([r for r in rows if "loss" in r]) == 6

    def fail(metrics):
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        finetune(recipe(tmp_path, source_dir, corpus, run="failing", **{"data.held_out": 0}), callbacks=[fail])
    assert gc.isenabled()
    enabled.clear()
    finetune(recipe(tmp_path, source_dir, corpus, run="auto", **{"data.held_out": 0,
                                                                 "train.collect_garbage": False}),
             callbacks=[lambda metrics: enabled.append(gc.isenabled())])
    assert enabled == [True] * 6
