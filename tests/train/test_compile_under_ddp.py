"""Regional compilation under DDP keeps one graph a layer: dynamo's DDP optimizer, made for a model compiled
whole, split each compiled layer's graph at DDP's bucket boundaries (on two H200s, 9 Inductor graphs where one
process compiles 5, and AOTAutograd's cache bypassed for the split ones)."""

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.recipes import torchrun, torchrun_failure

SCRIPT = ["-m", "tests.helpers.ddp_graphs"]


def counted(lines: str) -> dict:
    return json.loads(lines.strip().splitlines()[-1])


def test_ddp_compiles_the_layers_graphs_of_one_process():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    alone = subprocess.run([sys.executable, *SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert alone.returncode == 0, alone.stderr[-3000:]
    done = torchrun(SCRIPT, env)
    if done.returncode != 0:
        pytest.fail(torchrun_failure(done.stderr))
    assert counted(done.stdout) == counted(alone.stdout)
    assert counted(done.stdout)["cache_bypassed"] == 0
