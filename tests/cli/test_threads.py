"""`t2r` on a busy machine: torch gets the CPU threads other work leaves free (`t2r.cli.threads`)."""

import os
import subprocess
import sys

from t2r.cli import threads


def test_free_threads_are_the_cpus_the_load_leaves():
    two = [0, 1]
    assert [threads.free_threads(load, two, cores=2) for load in (0.0, 0.4, 0.6, 1.0, 1.6, 3.5, 40.0)] == \
        [2, 2, 1, 1, 1, 1, 1]
    assert threads.free_threads(3.0, list(range(16)), cores=8) == 8  # never more than the physical cores
    assert threads.free_threads(10.2, list(range(16)), cores=8) == 6


def test_a_busy_machine_lowers_torch_threads_before_torch_loads(tmp_path):
    """In a fresh process (torch not loaded): at load 3.5 on 2+ CPUs torch starts with 1 thread and the note says
    why; OMP_NUM_THREADS set by the user, or torch loaded already, is left alone."""
    script = ("import os, sys; os.getloadavg = lambda: (%s, 0.0, 0.0); sys.argv = ['t2r']  # as the command\n"
              "from t2r.cli import threads\n"
              "chosen = threads.choose(); threads.note(); threads.note()\n"
              "import torch; print(chosen, os.environ.get('OMP_NUM_THREADS'), torch.get_num_threads())\n"
              "os.environ.pop('OMP_NUM_THREADS', None); print(threads.choose())")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    busy = f"{len(threads.cpus()) + 1.5}"
    done = subprocess.run([sys.executable, "-c", script % busy], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)
    cores = threads.physical_cores(threads.cpus())
    if cores == 1:  # nothing to lower
        assert done.stdout.split() == ["None", "None", "1", "None"], done.stderr
        return
    assert done.stdout.split() == ["1", "1", "1", "None"], done.stderr
    assert done.stderr.count("note: ") == 1  # said once
    assert f"note: 1 CPU thread for torch, not {cores}: the machine is busy (load average {busy} on" in done.stderr
    assert "OMP_NUM_THREADS=N sets the count" in done.stderr
    done = subprocess.run([sys.executable, "-c", script % busy], capture_output=True, text=True, cwd=tmp_path,
                          env={**env, "OMP_NUM_THREADS": "2"}, timeout=300)
    assert done.stdout.split() == ["None", "2", "2", "None"] and done.stderr == "", done.stderr
