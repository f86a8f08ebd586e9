"""Test session set-up and the fixtures several test packages share.

Without a GPU, Triton kernels run in Triton's CPU interpreter. Triton reads TRITON_INTERPRET when it is first
imported, so this must happen before any test module imports it (kernel tests then run at small shapes on
fp32/fp16; bf16 is checked on the GPU). The helpers the fixtures call live in tests/helpers/.
"""

import os
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _free_threads() -> int:
    """torch's CPU threads for the session, by the rule of the `t2r` command (`t2r.cli.threads`): the cores the
    load average leaves free. On a busy 2-core machine torch's two threads wait on each other at every op: the
    suite took 34 min at load 2-6 (tests/layers/test_window.py 313 s of it, 50 s with one thread); on an idle
    machine nothing changes. OMP_NUM_THREADS, when set, decides."""
    from t2r.cli.threads import cpus, free_threads, physical_cores

    if "OMP_NUM_THREADS" in os.environ or not hasattr(os, "getloadavg"):
        return torch.get_num_threads()
    threads = min(torch.get_num_threads(), free_threads(os.getloadavg()[0], cpus(), physical_cores(cpus())))
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 1))  # pytest-xdist's workers share the cores
    return max(1, threads // workers)


torch.set_num_threads(_free_threads())

from tests.helpers.models import ARCHS, TARGETS, save_tiny_source  # noqa: E402  (imports triton: after the above)
from tests.helpers.recipes import write_corpus  # noqa: E402
from tests.helpers.triton import quick_device_calls  # noqa: E402

quick_device_calls()  # Triton's interpreter, without its repeated patching at each device-function call


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer) of the real default source, loaded once per session; skips without network or cache."""
    from t2r.sources import load_source

    try:
        return load_source("smollm2")
    except RuntimeError as err:  # no network and no cached copy
        pytest.skip(str(err))


@pytest.fixture(autouse=True, scope="session")
def _eval_scores_in_a_temporary_cache(tmp_path_factory):
    """`t2r eval` stores baseline scores in $T2R_CACHE/eval: tests keep theirs apart from the user's."""
    from t2r.eval import result_cache

    root = tmp_path_factory.mktemp("eval-cache")
    original, result_cache.default_root = result_cache.default_root, lambda: root
    yield root
    result_cache.default_root = original


@pytest.fixture(autouse=True, scope="session")
def _datasets_cache_in_a_temporary_directory(tmp_path_factory):
    """Keep `datasets`' Arrow cache (local files read as datasets) out of the user's home directory."""
    path = str(tmp_path_factory.getbasetemp() / "hf_datasets")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_DATASETS_CACHE", path)  # read when datasets is first imported
        if "datasets" in sys.modules:  # imported already, by a test module
            patch.setattr(sys.modules["datasets"].config, "HF_DATASETS_CACHE", path)
        yield


@pytest.fixture(scope="module")
def one_thread():
    """Tiny ops: intra-op threads only add contention (x100 per step on a busy 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(params=ARCHS)
def arch(request):
    """Every registered source architecture."""
    return request.param


@pytest.fixture(params=TARGETS)
def target(request):
    """Every registered target."""
    return request.param


@pytest.fixture(scope="module")
def source_dir(tmp_path_factory):
    """A tiny random Llama with the character tokenizer, saved like a hub checkpoint."""
    return save_tiny_source(tmp_path_factory.mktemp("source"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """60 short documents as JSON lines (`tests.helpers.recipes.write_corpus`)."""
    return write_corpus(tmp_path_factory.mktemp("data") / "train.jsonl")


@pytest.fixture
def manifest_checks(monkeypatch):
    """The names of the threads that ran each model directory check (`t2r.manifest._check`) in the test: a check
    started ahead by `verify_ahead` runs in `t2r-verify <directory name>`."""
    import threading

    from t2r import manifest

    names, check = [], manifest._check
    monkeypatch.setattr(manifest, "_check", lambda *a: names.append(threading.current_thread().name) or check(*a))
    return names
