"""Where a training stream is read ahead (`data.reader`), and the server its reader processes fork from. Standard
library only: the command line starts that server before it imports torch (`start_readers_early`), so the
server's own imports (torch, transformers, t2r: 10-20 s on a GPU machine) run beside the trainer's instead of
after them. A resumed run loads in seconds and then waited for them: `first batches` 12.0 s of a 40.9 s resume
on an H100 (2026-11-27)."""

from __future__ import annotations

import glob
import multiprocessing
import os

PREFETCH = 2  # micro-batches a training stream tokenises and packs ahead, beside the step that trains
READER_MODULE = "t2r.train.batches"
"""What the server imports once, for every reader it forks (the module that makes micro-batches)."""


def resolved_reader(reader: str | None, on_gpu: bool, prefetch: int = PREFETCH) -> str:
    """Where a stream reads ahead (`data.reader`): auto (or None) is a process beside a GPU, a thread on the CPU
    (where the steps compute rather than launch, and a process would only add its start)."""
    if reader in (None, "auto"):
        return "process" if on_gpu and prefetch > 0 else "thread"
    if reader not in ("process", "thread"):
        raise ValueError(f"reader={reader!r}: one of auto, process, thread")
    return reader


def reader_context():
    """forkserver (its server imports `READER_MODULE` once; every reader forks from it), or spawn where there is
    no forkserver (Windows)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([READER_MODULE])
    return context


def start_readers() -> None:
    """Starts the forkserver that reader processes fork from (once a process; its imports run beside whatever
    this process does next)."""
    if reader_context().get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


def gpu_visible() -> bool:
    """Whether this process will likely see an NVIDIA GPU, asked without importing torch: a device node and
    CUDA_VISIBLE_DEVICES not hiding every card. A guess for starting early only: a wrong one costs an idle
    server, or the later start."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", "0").strip() in ("", "-1"):
        return False
    return bool(glob.glob("/dev/nvidia[0-9]*"))


def start_readers_early(reader: str | None) -> None:
    """The command line's first step for a training run: the reader server started now, where the recipe's
    stream will be read in a process (`data.reader`, auto beside a GPU)."""
    if resolved_reader(reader, on_gpu=gpu_visible()) == "process":
        start_readers()
