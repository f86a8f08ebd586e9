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
from tests.helpers.recipes import recipe, torchrun_failure

OVERRIDES = {"train.tokens_per_step": 256, "train.max_steps": 4, "data.held_out": 0, "checkpoint.every_steps": 2}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, source_dir, corpus):
    """The final weights of one process training 4 steps straight: what every run of this file must end with
    (trained once for the file; each test trained its own copy before)."""
    path = tmp_path_factory.mktemp("one-process")
    finetune(recipe(path, source_dir, corpus, run="straight", **OVERRIDES))
    return load_file(path / "straight" / "final" / "model.safetensors")


def test_two_processes_equal_one(tmp_path, source_dir, corpus, one_process):
    recipe(tmp_path, source_dir, corpus, run="ddp", **OVERRIDES)  # writes ddp.yaml
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29517",
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


def torchrun_finetune(config, overrides: dict, *extra: str, port: int = 29519):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
           "-m", "t2r.cli", "finetune", "--config", str(config), *[f"{k}={v}" for k, v in overrides.items()], *extra]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
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
        torchrun_finetune(tmp_path / "resumed.yaml", OVERRIDES, "--resume", port=29521)
    b = load_file(tmp_path / "resumed" / "final" / "model.safetensors")
    for name in one_process:
        torch.testing.assert_close(b[name], one_process[name], rtol=1e-5, atol=1e-5, msg=name)


def test_two_processes_measure_the_held_out_loss_of_one(tmp_path, source_dir, corpus):
    """The held-out loss (the final metrics, the collapse guard's reference) is the mean over all held-out
    micro-batches whatever the process count, the same on every process, and every process runs as many forwards
    (under FSDP each gathers weights: an odd number of micro-batches left one process waiting forever)."""
    import json

    overrides = {"train.tokens_per_step": 256, "train.max_steps": 2, "data.held_out": 7}
    finetune(recipe(tmp_path, source_dir, corpus, run="single", **overrides))
    recipe(tmp_path, source_dir, corpus, run="two", **overrides)  # writes two.yaml
    torchrun_finetune(tmp_path / "two.yaml", overrides, port=29525)
    one, two = (json.loads((tmp_path / run / "final_metrics.json").read_text()) for run in ("single", "two"))
    assert one["validation_loss"] == pytest.approx(two["validation_loss"], rel=1e-5)
