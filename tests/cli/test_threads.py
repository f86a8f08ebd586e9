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
              "threads.busy_now = lambda cpu_ids: float(len(cpu_ids))  # every CPU busy now as well\n"
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
    assert "of them busy now)" in done.stderr
    assert "OMP_NUM_THREADS=N sets the count" in done.stderr
    done = subprocess.run([sys.executable, "-c", script % busy], capture_output=True, text=True, cwd=tmp_path,
                          env={**env, "OMP_NUM_THREADS": "2"}, timeout=300)
    assert done.stdout.split() == ["None", "2", "2", "None"] and done.stderr == "", done.stderr


def test_a_load_average_left_by_finished_work_takes_no_thread(monkeypatch):
    """The 1-minute load average lags: after `pip install` in the README's first command line it read ~1 on 2
    idle cores, and `t2r run` took 1 thread of 2. The CPUs' busy time now decides where it is lower."""
    environ = {}
    monkeypatch.setattr(threads.sys, "modules", {k: v for k, v in sys.modules.items() if k != "torch"})
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (len(threads.cpus()) + 1.5, 0.0, 0.0))
    monkeypatch.setattr(threads, "busy_now", lambda cpu_ids: 0.0)
    assert threads.choose(environ) is None and "OMP_NUM_THREADS" not in environ
    monkeypatch.setattr(threads, "busy_now", lambda cpu_ids: None)  # no /proc/stat: the load average decides
    if threads.physical_cores(threads.cpus()) > 1:
        assert threads.choose(environ) == 1 and environ["OMP_NUM_THREADS"] == "1"


def test_busy_now_counts_the_cpus_a_spinning_process_keeps_busy():
    """A process spinning on one CPU reads as about one busy CPU (where /proc/stat exists)."""
    cpu_ids = threads.cpus()
    if threads.busy_now(cpu_ids) is None:
        return
    spinner = subprocess.Popen([sys.executable, "-c", "import os, time\nos.sched_setaffinity(0, {%d})\n"
                                "end = time.time() + 5\nwhile time.time() < end: pass" % cpu_ids[0]])
    try:
        import time

        time.sleep(0.5)
        busy = threads.busy_now([cpu_ids[0]], seconds=0.5)
    finally:
        spinner.kill()
    assert busy > 0.8, busy
