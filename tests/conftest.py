"""Test session set-up: without a GPU, Triton kernels run in Triton's CPU interpreter.

Triton reads TRITON_INTERPRET when it is first imported, so this must happen before any test module
imports it (kernel tests then run at small shapes on fp32/fp16; bf16 is checked on the GPU).
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


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
