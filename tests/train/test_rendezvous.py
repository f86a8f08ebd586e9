"""WORLD_SIZE > 1 set without the other processes (no launcher): one line naming the variables after
`$T2R_RENDEZVOUS_TIMEOUT` seconds, exit code 2 and nothing written (before: it waited without end)."""

import os
import subprocess
import sys
import time

import pytest

from t2r.train import rendezvous
from tests.helpers.recipes import free_port, recipe

RANKS = ["0", "1"]  # the master waiting for a worker; a worker waiting for a master


@pytest.fixture(scope="module")
def lone_processes(tmp_path_factory, source_dir, corpus):
    """Rank 0 and rank 1, each started alone (its own port and directory), side by side: each spends ~8 s
    importing on one core and 3 s waiting, so two at once take the time of one. {rank: (run directory, port,
    completed process, seconds)}."""
    started = {}
    for rank in RANKS:
        tmp_path = tmp_path_factory.mktemp(f"rank{rank}")
        recipe(tmp_path, source_dir, corpus)  # writes run.yaml
        port = free_port()
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd(), "WORLD_SIZE": "2", "RANK": rank,
               "LOCAL_RANK": rank, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), rendezvous.ENV: "3"}
        proc = subprocess.Popen([sys.executable, "-m", "t2r", "finetune", "--config", str(tmp_path / "run.yaml")],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        started[rank] = (tmp_path, port, proc, time.monotonic())
    ended = {}
    for rank, (tmp_path, port, proc, start) in started.items():
        out, err = proc.communicate(timeout=240)
        done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        ended[rank] = (tmp_path, port, done, time.monotonic() - start)
    return ended


@pytest.mark.parametrize("rank", RANKS)
def test_a_process_group_that_never_forms_ends_in_one_line(lone_processes, rank):
    tmp_path, port, done, seconds = lone_processes[rank]
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr == (f"t2r: error: the other 1 process(es) did not join within 3 s (WORLD_SIZE=2 RANK={rank} "
                           f"LOCAL_RANK={rank} MASTER_ADDR=127.0.0.1 MASTER_PORT={port}): start every process with a "
                           "launcher (accelerate launch, torchrun), or unset WORLD_SIZE and RANK to train in one "
                           f"process ({rendezvous.ENV} sets the wait)\n")
    assert seconds < 200 and not (tmp_path / "run").exists()


def test_the_wait_is_read_from_the_environment(monkeypatch):
    monkeypatch.delenv(rendezvous.ENV, raising=False)
    assert rendezvous.deadline() == rendezvous.DEFAULT_SECONDS
    monkeypatch.setenv(rendezvous.ENV, "600")
    assert rendezvous.deadline() == 600
    for bad in ("0", "nan", "inf", "ten"):
        monkeypatch.setenv(rendezvous.ENV, bad)
        with pytest.raises(ValueError, match=f"{rendezvous.ENV}='{bad}': give the seconds to wait"):
            rendezvous.deadline()


def test_one_process_joins_without_a_deadline(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv(rendezvous.ENV, "ten")  # not even read
    assert rendezvous.joined(lambda: "state") == "state"
