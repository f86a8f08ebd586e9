"""SIGTERM and SIGINT in the middle of a step: the step finishes, its checkpoint is written, the command exits with
128 + the signal's number and a message; `--resume` then ends with the weights of a run never interrupted.
(Before: SIGTERM ended the process with -15 and no message, Ctrl-C with a KeyboardInterrupt traceback; neither
wrote a checkpoint.)"""

import os
import signal

import pytest
import torch

import t2r.train.stages as stages
from t2r.cli import main
from t2r.train import checkpoint as ckpt
from t2r.train import finetune
from t2r.train.signals import StopOnSignal
from tests.helpers.recipes import final_weights, recipe


@pytest.fixture(autouse=True)
def python_sigint_handler():
    """Python's own SIGINT handler during each test: a process started in the background by a shell inherits
    SIGINT ignored, which these tests would read as the handler to give back."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, source_dir, corpus):
    r = recipe(tmp_path_factory.mktemp("straight"), source_dir, corpus)
    finetune(r)
    return final_weights(r)


def signal_in_micro_batch(monkeypatch, signum, micro_batch):
    """Send `signum` to this process while computing the loss of micro-batch `micro_batch` (1-based)."""
    calls = {"n": 0}
    real = stages.stage_loss

    def signalling(*args, **kwargs):
        loss = real(*args, **kwargs)

        def inner(batch):
            calls["n"] += 1
            if calls["n"] == micro_batch:
                os.kill(os.getpid(), signum)
            return loss(batch)

        return inner

    monkeypatch.setattr(stages, "stage_loss", signalling)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_mid_step_finishes_it_writes_a_checkpoint_and_resumes_exactly(tmp_path, source_dir, corpus, capsys,
                                                                               monkeypatch, uninterrupted, signum):
    recipe(tmp_path, source_dir, corpus)  # run.yaml: 6 steps of 2 micro-batches, checkpoints every 3
    signal_in_micro_batch(monkeypatch, signum, 9)  # the first micro-batch of step 5
    code = main(["finetune", "--config", str(tmp_path / "run.yaml")])
    captured = capsys.readouterr()
    assert code == 128 + signum, captured.err
    name = signal.Signals(signum).name
    assert f"received {name}: finishing this step, then writing a checkpoint" in captured.out
    assert captured.err.strip() == (f"t2r finetune: stopped by {name} after step 5: checkpoint step-00000005 written; "
                                    "--resume continues the run")
    assert [c.name for c in ckpt.checkpoints(tmp_path / "run")] == ["step-00000003", "step-00000005"]
    assert not (tmp_path / "run" / "final").exists()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handlers are given back
    monkeypatch.undo()
    assert main(["finetune", "--config", str(tmp_path / "run.yaml"), "--resume"]) == 0
    for name, value in uninterrupted.items():
        assert torch.equal(final_weights(recipe(tmp_path, source_dir, corpus))[name], value), name


def test_a_second_signal_stops_at_once():
    now = [100.0]
    with StopOnSignal(log=lambda text: None, clock=lambda: now[0]) as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.signum == signal.SIGINT
        now[0] += 1.5
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)


def test_the_first_signal_delivered_twice_is_one_stop():
    """GNU timeout sends its signal to the command, then to the command's process group: the command gets it twice
    at once. Within `REPEAT_S` that is still the first stop; after it, a signal stops at once."""
    now = [100.0]
    with StopOnSignal(log=lambda text: None, clock=lambda: now[0]) as stop:
        os.kill(os.getpid(), signal.SIGINT)
        now[0] += 0.2
        os.kill(os.getpid(), signal.SIGINT)  # no KeyboardInterrupt
        assert stop.signum == signal.SIGINT
        now[0] += 1.0
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.parametrize("rank", ["0", "1"])
def test_a_signal_that_stops_every_process_is_reported_by_the_main_one(monkeypatch, capsys, rank):
    """Under a launcher every process stops on the same signal after the same step: one line in the shared log."""
    from t2r.cli import app
    from t2r.train.signals import Stopped

    def stopped(args):
        raise Stopped("stopped by SIGTERM after step 61: checkpoint step-00000061 written; --resume continues the run",
                      signal.SIGTERM)

    monkeypatch.setenv("RANK", rank)
    monkeypatch.setattr(app, "run_cache", stopped)
    assert main(["cache"]) == 128 + signal.SIGTERM
    assert ("stopped by SIGTERM" in capsys.readouterr().err) is (rank == "0")


def test_a_stopped_run_leaves_no_reader_process(tmp_path, source_dir, corpus, capsys, monkeypatch):
    """The stream read in a process (`data.reader: process`, auto beside a GPU): a signal's stop closes it. The
    reader ignores SIGTERM, so one left open kept the stopped command from exiting: multiprocessing's exit hook
    joined it forever (an H100 run stopped by SIGINT hung until SIGKILL, 2026-11-27)."""
    import multiprocessing

    recipe(tmp_path, source_dir, corpus)
    signal_in_micro_batch(monkeypatch, signal.SIGINT, 9)
    code = main(["finetune", "--config", str(tmp_path / "run.yaml"), "data.reader=process"])
    assert code == 128 + signal.SIGINT, capsys.readouterr().err
    assert multiprocessing.active_children() == []
