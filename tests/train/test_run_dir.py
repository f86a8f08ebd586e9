"""A checkpoint directory belongs to one run: a fresh run refuses another run's results (or deletes them
with overwrite), a second run is locked out while the first is alive, a run killed with SIGKILL (after a
step, or in the middle of writing a checkpoint) leaves a stale lock that the next run takes over, and its
resumption ends with the weights of a run that was never interrupted."""

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from t2r.train import RunDirError, finetune
from t2r.train import checkpoint as ckpt
from t2r.train.run_dir import RunLock, holder
from tests.helpers.recipes import final_weights, recipe

# Runs the recipe in a child process and stops it, holding the run directory's lock, at a chosen point:
# after optimizer step N (`after-step-N`), while checkpoint N is being written, before its manifest
# (`mid-save-N`), or once final/ is written aside but not yet renamed into place (`mid-final-N`). It then writes
# its pid to the `ready` file and sleeps until the test kills it.
CHILD = """
import os, sys, time
from pathlib import Path
from t2r import manifest
from t2r.train import finetune, load_recipe

recipe_path, point, ready = sys.argv[1:4]
n = int(point.rsplit("-", 1)[1])

def stop_here():
    Path(ready).write_text(str(os.getpid()))
    time.sleep(600)

callbacks = []
if point.startswith("after-step-"):
    callbacks.append(lambda metrics: stop_here() if metrics["step"] == n else None)
elif point.startswith("mid-save-"):
    write_manifest = manifest.write
    def paused(directory):
        if directory.name == f".tmp-step-{n:08d}":
            stop_here()
        return write_manifest(directory)
    manifest.write = paused
else:  # mid-final-N: final/ written to .tmp-final, not yet renamed
    replace = os.replace
    def paused_replace(src, dst):
        if Path(dst).name == "final":
            stop_here()
        return replace(src, dst)
    os.replace = paused_replace
finetune(load_recipe(recipe_path), callbacks=callbacks)
"""


def launch_child(tmp_path, run, point):
    """The child of `CHILD` for `tmp_path / f"{run}.yaml"`, started; `ready_child` waits for its stop point."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    return subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / f"{run}.yaml"), point,
                             str(tmp_path / f"{run}.ready")],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def ready_child(tmp_path, run, proc):
    ready = tmp_path / f"{run}.ready"
    deadline = time.time() + 240
    while not ready.exists():
        if proc.poll() is not None:
            pytest.fail(f"child exited with {proc.returncode}:\n{proc.stderr.read()[-3000:]}")
        if time.time() > deadline:
            proc.kill()
            pytest.fail("child never reached its stop point")
        time.sleep(0.1)
    return proc


def kill(proc):
    proc.kill()  # SIGKILL: no cleanup, no lock release
    proc.wait()
    proc.stderr.close()


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=0, msg=name)


@pytest.fixture(scope="module")
def straight(tmp_path_factory, source_dir, corpus):
    """The reference: the default tiny recipe (6 steps, checkpoints every 3) run without interruption."""
    r = recipe(tmp_path_factory.mktemp("straight"), source_dir, corpus)
    finetune(r)
    return final_weights(r)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory, source_dir, corpus):
    """{point: (directory, child)}: a child of the default tiny recipe stopped at each point the tests below
    kill it at, each in its own directory. All start at once: each child spends ~8 s importing on one core, so
    side by side on 2 cores they take half the time they took one after the other. Any left alive are killed."""
    children = {}
    for point in ("after-step-4", "after-step-2", "mid-save-6", "mid-final-6"):
        path = tmp_path_factory.mktemp(point)
        recipe(path, source_dir, corpus)  # writes run.yaml for the child
        children[point] = (path, launch_child(path, "run", point))
    try:
        for path, proc in children.values():
            ready_child(path, "run", proc)
        yield children
    finally:
        for _, proc in children.values():
            if proc.returncode is None:
                kill(proc)


def test_a_second_run_is_locked_out_and_a_killed_run_resumes_exactly(stopped, source_dir, corpus, straight, capsys):
    tmp_path, proc = stopped["after-step-4"]
    r = recipe(tmp_path, source_dir, corpus)
    try:
        for resume in (False, True):  # while the child trains, neither a fresh run nor a resume may start
            with pytest.raises(RunDirError, match=rf"is in use by another run \(pid {proc.pid} on "):
                finetune(r, resume=resume)
        assert not (tmp_path / "run" / "final").exists()
    finally:
        kill(proc)
    assert holder(r.checkpoint.dir)["pid"] == proc.pid  # the crash left its lock behind
    assert ckpt.latest(r.checkpoint.dir).name == "step-00000003"
    finetune(r, resume=True)
    out = capsys.readouterr().out
    assert f"took over a stale lock on {tmp_path / 'run'}: pid {proc.pid} on" in out
    assert "resumed from" in out and "step 3," in out
    assert_same_weights(straight, final_weights(r))
    assert holder(r.checkpoint.dir) is None  # released cleanly
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4, 5, 6]  # the killed run's step 4 was dropped
    assert [r["step"] for r in rows if "held_out_loss" in r] == [6]  # and redone, nothing interleaved


def test_a_run_killed_before_its_first_checkpoint_restarts_with_resume(stopped, source_dir, corpus, straight,
                                                                        capsys):
    """Before: `--resume: no checkpoint ...; starting afresh`, then `error: ... holds another run ... --overwrite`."""
    tmp_path, proc = stopped["after-step-2"]
    r = recipe(tmp_path, source_dir, corpus)
    kill(proc)  # checkpoints every 3 steps: none yet
    assert ckpt.latest(r.checkpoint.dir) is None and (tmp_path / "run" / "metrics.jsonl").is_file()
    finetune(r, resume=True)
    assert ("--resume: no checkpoint in {}; starting afresh (the run stopped before its first checkpoint; replacing "
            "its metrics.jsonl, recipe.yaml)".format(tmp_path / "run")) in capsys.readouterr().out
    assert_same_weights(straight, final_weights(r))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "loss" in row] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("point, half, latest", [("mid-save-6", ".tmp-step-00000006", "step-00000003"),
                                                 ("mid-final-6", ".tmp-final", "step-00000006")])
def test_killed_while_writing_a_checkpoint_or_the_final_model(stopped, source_dir, corpus, straight, point, half,
                                                             latest):
    tmp_path, proc = stopped[point]
    r = recipe(tmp_path, source_dir, corpus)
    kill(proc)
    half = tmp_path / "run" / half
    assert (half / "model.safetensors").is_file() and not (tmp_path / "run" / "final").exists()
    assert ckpt.latest(r.checkpoint.dir).name == latest
    finetune(r, resume=True)
    assert not half.exists()  # cleaned up by the next save
    assert_same_weights(straight, final_weights(r))


def test_a_fresh_run_refuses_another_runs_directory_unless_overwrite(tmp_path, source_dir, corpus, capsys):
    old = recipe(tmp_path, source_dir, corpus, **{"train.max_steps": 9})
    finetune(old)
    before = sorted(p.name for p in (tmp_path / "run").iterdir())
    new = recipe(tmp_path, source_dir, corpus, **{"train.lr": 1e-3})
    with pytest.raises(RunDirError, match=r"holds another run \(step-00000006/, step-00000009/, final/, "
                                          r"metrics.jsonl, final_metrics.json, \.\.\.\): --resume continues it, "
                                          r"--overwrite deletes it"):
        finetune(new)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == before  # untouched
    finetune(new, overwrite=True)
    assert "--overwrite: deleted the previous run" in capsys.readouterr().out
    # the old step 9 is gone, so the new run's own checkpoints survive pruning and are the ones resumed
    assert [p.name for p in ckpt.checkpoints(new.checkpoint.dir)] == ["step-00000003", "step-00000006"]
    assert "lr: 0.001" in (tmp_path / "run" / "step-00000006" / "recipe.yaml").read_text()
    with pytest.raises(ValueError, match="--resume and --overwrite exclude each other"):
        finetune(new, resume=True, overwrite=True)


def test_pruning_never_deletes_the_checkpoint_just_written(tmp_path):
    for step in (3, 6, 60):
        (tmp_path / f"step-{step:08d}").mkdir()
    ckpt.prune(tmp_path, keep_last=2, current=tmp_path / "step-00000006")
    assert [p.name for p in ckpt.checkpoints(tmp_path)] == ["step-00000003", "step-00000006", "step-00000060"]
    (tmp_path / "step-00000009").mkdir()
    ckpt.prune(tmp_path, keep_last=1, current=tmp_path / "step-00000009")
    assert [p.name for p in ckpt.checkpoints(tmp_path)] == ["step-00000009", "step-00000060"]


def test_lock_is_exclusive_and_reports_its_holder(tmp_path):
    first, second = RunLock(tmp_path), RunLock(tmp_path)
    assert first.acquire() is None
    with pytest.raises(RunDirError, match=rf"in use by another run \(pid {os.getpid()} on "):
        second.acquire()
    first.release()
    assert second.acquire() is None  # released cleanly: not reported as stale
    second.release()


@pytest.mark.parametrize("text", ["[1, 2]", "7", '"pid"', "{not json"])
def test_a_lock_file_of_another_shape_is_an_unknown_holder(tmp_path, text):
    (tmp_path / ".lock").write_text(text)
    assert holder(tmp_path) == {"pid": "?", "host": "?", "started": None}
    lock = RunLock(tmp_path)
    assert lock.acquire() == (f"took over a stale lock on {tmp_path}: pid ? on ?, started ? ended without "
                              "releasing it (crashed or killed)")
    with pytest.raises(RunDirError, match=r"in use by another run \(pid \d+ on "):
        RunLock(tmp_path).acquire()
    lock.release()


def test_overwrite_never_deletes_through_a_symbolic_link(tmp_path, source_dir, corpus):
    """Before: `Cannot call rmtree on a symbolic link`, naming no path."""
    r = recipe(tmp_path, source_dir, corpus)
    elsewhere = tmp_path / "models" / "kept"
    elsewhere.mkdir(parents=True)
    (elsewhere / "model.safetensors").write_text("the user's")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "run" / "final").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(RunDirError) as info:
        finetune(r, overwrite=True)
    assert str(info.value) == (
        f"--overwrite: {tmp_path / 'run' / 'final'} is a symbolic link (to {elsewhere}); t2r deletes only what it "
        "wrote, never through a link: remove the link (rm it, the target stays) or set checkpoint.dir to a new "
        "directory; nothing was deleted")
    assert (elsewhere / "model.safetensors").read_text() == "the user's"
    assert (tmp_path / "run" / "metrics.jsonl").is_file() and (tmp_path / "run" / "final").is_symlink()
