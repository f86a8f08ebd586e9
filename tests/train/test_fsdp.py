"""torch's FSDP2 (`fully_shard` per decoder layer, the wrapping accelerate's FSDP2 uses) on two CPU processes
over gloo trains converted models, every target and a hybrid, to the weights one unsharded process reaches on the
same global batches (each rank's loss is the mean over its half, and FSDP averages the gradients)."""

import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.train import fsdp_worker


def test_fully_sharded_training_equals_one_process(tmp_path):
    fsdp_worker.main(str(tmp_path))  # the one-process reference, in this process
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29531",
           "-m", "tests.train.fsdp_worker", str(tmp_path)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        pytest.fail(f"torchrun failed:\n{done.stderr[-3000:]}")
    for name in fsdp_worker.CASES:
        one, two = (load_file(tmp_path / f"{name}-{w}.safetensors") for w in (1, 2))
        assert one.keys() == two.keys()
        for key in one:  # rounding only: the reduction runs in another order
            torch.testing.assert_close(two[key], one[key], rtol=1e-5, atol=1e-5, msg=f"{name}: {key}")
