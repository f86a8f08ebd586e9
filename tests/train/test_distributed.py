"""Data parallel training (DDP through accelerate, two CPU processes over gloo, launched with
torchrun as `accelerate launch` does) ends with the weights of one process training on the same
global batches: the stream is sharded by micro-batch and gradients are averaged."""

import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from t2r.train import finetune
from tests.helpers.recipes import free_port, recipe, torchrun, torchrun_failure

OVERRIDES = {"train.tokens_per_step": 256, "train.max_steps": 4, "data.held_out": 7, "checkpoint.every_steps": 2}


@pytest.fixture(scope="module")
def one_run(tmp_path_factory, source_dir, corpus):
    """The run directory of one process training 4 steps straight: what every run of this file must end with
    (trained once for the file; each test trained its own copy before)."""
    path = tmp_path_factory.mktemp("one-process")
    finetune(recipe(path, source_dir, corpus, run="straight", **OVERRIDES))
    return path / "straight"


@pytest.fixture(scope="module")
def one_process(one_run):
    """The final weights of `one_run`."""
    return load_file(one_run / "final" / "model.safetensors")


def test_two_processes_equal_one(tmp_path, source_dir, corpus, one_run, one_process):
    """Two processes end with the weights of one, and measure the same held-out loss (the final metrics, the
    collapse guard's reference): the mean over all held-out micro-batches whatever the process count, the same on
    every process, and every process runs as many forwards (under FSDP each gathers weights: an odd number of
    micro-batches left one process waiting forever)."""
    import json

    recipe(tmp_path, source_dir, corpus, run="ddp", **OVERRIDES)  # writes ddp.yaml
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           "-m", "t2r.cli", "finetune", "--config", str(tmp_path / "ddp.yaml"),
           *[f"{k}={v}" for k, v in OVERRIDES.items()]]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        pytest.fail(torchrun_failure(done.stderr))
    assert "x 2 processes per step" in done.stdout + done.stderr
    a = one_process
    b = load_file(tmp_path / "ddp" / "final" / "model.safetensors")
    start = load_file(source_dir / "model.safetensors")
    assert max((a[k] - start[k]).abs().max().item() for k in start) > 1e-3  # training moved the weights
    for name in a:  # rounding only: one process accumulates in another order and with other thread counts
        torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=1e-5, msg=name)
    one, two = (json.loads((run / "final_metrics.json").read_text()) for run in (one_run, tmp_path / "ddp"))
    assert one["validation_loss"] == pytest.approx(two["validation_loss"], rel=1e-5)


def torchrun_finetune(config, overrides: dict, *extra: str):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    done = torchrun(["-m", "t2r.cli", "finetune", "--config", str(config),
                     *[f"{k}={v}" for k, v in overrides.items()], *extra], env)
    if done.returncode != 0:
        pytest.fail(torchrun_failure(done.stderr))


@pytest.mark.parametrize("first, then", [(2, 1), (1, 2)])
def test_resume_on_another_number_of_processes(tmp_path, source_dir, corpus, one_process, first, then):
    """`first` processes train 2 steps, `then` processes resume to step 4: the same weights as one process
    training 4 steps straight (the stream position and the global batch do not depend on the process count)."""
    resumed = recipe(tmp_path, source_dir, corpus, run="resumed", **OVERRIDES)  # also writes resumed.yaml
    part = {**OVERRIDES, "train.max_steps": 2}
    if first == 2:
        torchrun_finetune(tmp_path / "resumed.yaml", part)
        finetune(resumed, resume=True)
    else:
        finetune(recipe(tmp_path, source_dir, corpus, run="resumed", **part))
        torchrun_finetune(tmp_path / "resumed.yaml", OVERRIDES, "--resume")
    b = load_file(tmp_path / "resumed" / "final" / "model.safetensors")
    for name in one_process:
        torch.testing.assert_close(b[name], one_process[name], rtol=1e-5, atol=1e-5, msg=name)


def _children(pid: int) -> dict[str, int]:
    """{RANK: pid} of the worker processes a torchrun process started (read from /proc)."""
    from pathlib import Path

    ranks = {}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                env = (entry / "environ").read_bytes().decode(errors="replace").split("\0")
                ranks.update({item[5:]: int(entry.name) for item in env if item.startswith("RANK=")})
        except (OSError, ValueError, IndexError):  # a process that ended meanwhile
            continue
    return ranks


LONG = {"train.tokens_per_step": 256, "train.max_steps": 16, "data.held_out": 0, "checkpoint.every_steps": 2}


@pytest.fixture(scope="module")
def two_straight(tmp_path_factory, source_dir, corpus):
    """The final weights of two processes training `LONG`'s 16 steps straight through."""
    path = tmp_path_factory.mktemp("two-straight")
    recipe(path, source_dir, corpus, run="straight", **LONG)  # writes straight.yaml
    torchrun_finetune(path / "straight.yaml", LONG)
    return load_file(path / "straight" / "final" / "model.safetensors")


def _launch_and_wait(tmp_path, run: str, overrides: dict, steps: int):
    """torchrun of `run`'s recipe on two processes, returned once its metrics.jsonl holds `steps` rows."""
    import time

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           "-m", "t2r.cli", "finetune", "--config", str(tmp_path / f"{run}.yaml"),
           *[f"{k}={v}" for k, v in overrides.items()]]
    launcher = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics, deadline = tmp_path / run / "metrics.jsonl", time.monotonic() + 240
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= steps):
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()[1][-3000:]
        time.sleep(0.05)
    return launcher


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the workers through /proc")
def test_a_killed_process_ends_the_run_at_once_and_resume_finishes_it_exactly(tmp_path, source_dir, corpus,
                                                                                  two_straight):
    """SIGKILL to one of two processes mid-run: the launcher ends the other within seconds (no process waits for
    the dead one in a collective) and names the dead rank; the checkpoints left are whole (a save the kill cut short
    stays a `.tmp-` directory, never listed, removed by the resume); `--resume` on two
    processes finishes with the same weights, bit for bit, as two processes training straight through."""
    import signal
    import time

    from t2r.train import checkpoint as ckpt

    recipe(tmp_path, source_dir, corpus, run="killed", **LONG)  # writes killed.yaml
    launcher = _launch_and_wait(tmp_path, "killed", LONG, 4)
    os.kill(_children(launcher.pid)["1"], signal.SIGKILL)
    killed = time.monotonic()
    _, err = launcher.communicate(timeout=120)
    assert launcher.returncode != 0 and time.monotonic() - killed < 60
    assert "rank      : 1 (local_rank: 1)" in err and "Signal 9 (SIGKILL)" in err, err[-3000:]
    assert not (tmp_path / "killed" / "final").exists()
    left = ckpt.checkpoints(tmp_path / "killed")
    assert left and all(ckpt.verify(c) is None for c in left)
    torchrun_finetune(tmp_path / "killed.yaml", LONG, "--resume")
    assert not list((tmp_path / "killed").glob(".tmp-*"))  # a save the kill cut short is not kept
    a = two_straight
    b = load_file(tmp_path / "killed" / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the workers through /proc")
def test_a_stop_signal_to_one_process_stops_both_after_the_same_step(tmp_path, source_dir, corpus, two_straight):
    """SIGTERM to rank 1 alone (a scheduler stopping one node): both processes learn it at the next step's read,
    finish that step, write its checkpoint together and exit with 128 + 15; the main process says so once;
    `--resume` on two processes ends with the weights, bit for bit, of two processes training straight through."""
    import signal

    from t2r.train import checkpoint as ckpt

    overrides = {**LONG, "checkpoint.every_steps": 100}  # no checkpoint but the stop's
    recipe(tmp_path, source_dir, corpus, run="stopped", **overrides)  # writes stopped.yaml
    launcher = _launch_and_wait(tmp_path, "stopped", overrides, 3)
    os.kill(_children(launcher.pid)["1"], signal.SIGTERM)
    out, err = launcher.communicate(timeout=120)
    stops = [line for line in (out + err).splitlines() if "stopped by SIGTERM after step" in line]
    assert len(stops) == 1, (out + err)[-3000:]
    left = ckpt.checkpoints(tmp_path / "stopped")
    assert len(left) == 1 and ckpt.verify(left[0]) is None and f"after step {ckpt.step_of(left[0])}:" in stops[0]
    assert 3 <= ckpt.step_of(left[0]) < 16 and not (tmp_path / "stopped" / "final").exists()
    assert launcher.returncode != 0
    torchrun_finetune(tmp_path / "stopped.yaml", overrides, "--resume")
    b = load_file(tmp_path / "stopped" / "final" / "model.safetensors")
    assert two_straight.keys() == b.keys() and all(torch.equal(two_straight[k], b[k]) for k in b)


def test_a_full_disk_on_one_process_is_one_line_on_each_and_resume_finishes(tmp_path, source_dir, corpus):
    """Rank 1 finds its disk full while writing its part of the second checkpoint: it says so in one line, rank 0
    says in one line that process 1 could not write its part (instead of waiting for it in the next collective),
    the half-written copy is gone, the first checkpoint verifies and `--resume` finishes the run."""
    from t2r.train import checkpoint as ckpt

    recipe(tmp_path, source_dir, corpus, run="full", **OVERRIDES)  # writes full.yaml
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           "tests/train/disk_full_worker.py", "finetune", "--config", str(tmp_path / "full.yaml"),
           *[f"{k}={v}" for k, v in OVERRIDES.items()]]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stderr.splitlines() if line.startswith("t2r finetune: ")]
    assert done.returncode != 0 and len(lines) == 2, torchrun_failure(done.stderr)
    assert any("no space left on the disk of" in line and "checkpoint step-00000004" in line for line in lines)
    assert any(line.startswith("t2r finetune: error: process 1 could not write its part of checkpoint "
                               "step-00000004") for line in lines), lines
    run = tmp_path / "full"
    assert not list(run.glob(".tmp-*")) and [c.name for c in ckpt.checkpoints(run)] == ["step-00000002"]
    assert ckpt.verify(run / "step-00000002") is None
    torchrun_finetune(tmp_path / "full.yaml", OVERRIDES, "--resume")
    assert (run / "final" / "model.safetensors").is_file()


def test_gradients_synced_in_bf16_round_each_processs_gradient_before_the_mean(tmp_path, source_dir, corpus,
                                                                                 one_process):
    """`train.gradient_sync: bf16` (DDP's bf16 compression hook): two processes still train the weights of one up
    to the rounding of their gradients to bf16, which leaves them measurably apart from the fp32 sync's 1e-5."""
    overrides = {**OVERRIDES, "train.gradient_sync": "bf16"}
    recipe(tmp_path, source_dir, corpus, run="bf16", **overrides)  # writes bf16.yaml
    torchrun_finetune(tmp_path / "bf16.yaml", overrides)
    b = load_file(tmp_path / "bf16" / "final" / "model.safetensors")
    apart = max((b[k] - one_process[k]).abs().max().item() for k in one_process)
    for name in one_process:
        torch.testing.assert_close(b[name], one_process[name], rtol=0, atol=2e-3, msg=name)
    assert apart > 1e-5, apart
