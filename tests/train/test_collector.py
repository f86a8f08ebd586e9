"""The step loop's garbage collection (`t2r.train.collector`): automatic collection off inside a run of steps,
everything collected after its first step and the survivors frozen, the young generations after each later step
and everything every `full_every`."""

import gc

import pytest

from t2r.train.collector import StepCollector


@pytest.fixture
def generations():
    """(generation, whether automatic collection was on) of each collection Python runs while the test does."""
    seen = []

    def record(phase, info):
        if phase == "start":
            seen.append((info["generation"], gc.isenabled()))

    gc.callbacks.append(record)
    yield seen
    gc.callbacks.remove(record)


def explicit(generations):
    """The collections made while automatic collection was off: those the step loop asked for."""
    return [generation for generation, enabled in generations if not enabled]


@pytest.fixture
def unfrozen():
    """No frozen objects at the start (a test before may have frozen some and failed); none left after."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_inside_a_run_collection_waits_for_the_steps(generations, unfrozen):
    with StepCollector(full_every=3) as collector:
        assert not gc.isenabled()
        kept = [[] for _ in range(20_000)]  # far past the young generation's threshold, kept alive
        assert generations == []  # no automatic collection
        collector.step_done(1)
        assert gc.get_freeze_count() >= len(kept)  # what outlived the first step is out of later collections
        for step in (2, 3, 4):
            collector.step_done(step)
        assert explicit(generations) == [2, 1, 2, 1]
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_garbage_of_the_set_up_is_collected_before_the_freeze(unfrozen):
    class Cycle:
        pass

    with StepCollector() as collector:
        cycle = Cycle()
        cycle.me = cycle
        del cycle
        collector.step_done(1)
        assert not any(type(o) is Cycle for o in gc.get_objects())


def test_a_callers_freeze_and_disabled_collection_are_left_as_they_were(generations, unfrozen):
    with StepCollector(active=False) as collector:
        assert gc.isenabled()
        collector.step_done(100)
    assert generations == [] and gc.isenabled()
    gc.freeze()
    frozen = gc.get_freeze_count()
    assert frozen > 1000  # the test's process holds far more than the 1000 lists below
    with StepCollector() as collector:
        kept = [[] for _ in range(1000)]  # would be frozen by a second freeze
        collector.step_done(1)
        assert 0 < gc.get_freeze_count() <= frozen and len(kept) == 1000  # not frozen again, nor unfrozen
    assert 0 < gc.get_freeze_count() <= frozen
    gc.unfreeze()
    gc.disable()
    try:
        with StepCollector() as collector:
            collector.step_done(1)
        assert not gc.isenabled() and gc.get_freeze_count() == 0
    finally:
        gc.enable()


def test_a_run_collects_at_its_steps_and_restores_collection(tmp_path, source_dir, corpus, generations, unfrozen):
    """A 6-step run collects once after each step (everything after the first) and nothing else while its
    steps run; automatic collection is back on after it, also when a run of steps ends by an error."""
    from t2r.train import finetune
    from tests.helpers.recipes import recipe

    enabled = []
    finetune(recipe(tmp_path, source_dir, corpus, **{"data.held_out": 0}),
             callbacks=[lambda metrics: enabled.append(gc.isenabled())])
    assert enabled == [False] * 6 and gc.isenabled() and gc.get_freeze_count() == 0
    assert explicit(generations) == [2, 1, 1, 1, 1, 1]

    def fail(metrics):
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        finetune(recipe(tmp_path, source_dir, corpus, run="failing", **{"data.held_out": 0}), callbacks=[fail])
    assert gc.isenabled() and gc.get_freeze_count() == 0
    enabled.clear()
    generations.clear()
    finetune(recipe(tmp_path, source_dir, corpus, run="auto", **{"data.held_out": 0,
                                                                 "train.collect_garbage": False}),
             callbacks=[lambda metrics: enabled.append(gc.isenabled())])
    assert enabled == [True] * 6 and explicit(generations) == []
