"""torch's FSDP2 (`fully_shard` per decoder layer, the wrapping accelerate's FSDP2 uses) on two CPU processes
over gloo trains converted models, every target and a hybrid, to the weights one unsharded process reaches on the
same global batches (each rank's loss is the mean over its half, and FSDP averages the gradients)."""

import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

import t2r
from tests.helpers.models import tiny_source
from tests.helpers.recipes import free_port, torchrun, torchrun_failure
from tests.train import align_fsdp_worker, fsdp_worker, kl_fsdp_worker


def on_two_processes(module: str, tmp_path, *args: str) -> None:
    """`python -m module tmp_path *args` on two gloo processes under torchrun; its failure, readable."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    done = torchrun(["-m", module, str(tmp_path), *args], env)
    if done.returncode != 0:
        pytest.fail(torchrun_failure(done.stderr))


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """The weights both tests compare, in one directory: the one-process references (trained in this process)
    and both workers' FSDP2 runs, trained in one torchrun launch (two launches cost ~8 s more on 2 cores)."""
    path = tmp_path_factory.mktemp("fsdp")
    fsdp_worker.main(str(path))
    for mode in ("direct", "through"):
        align_fsdp_worker.main(str(path), mode)
    kl_fsdp_worker.main(str(path))
    on_two_processes("tests.train.fsdp_worker", path, "align")
    return path


def test_fully_sharded_training_equals_one_process(sharded):
    tmp_path = sharded
    for name in fsdp_worker.CASES:
        one, two = (load_file(tmp_path / f"{name}-{w}.safetensors") for w in (1, 2))
        assert one.keys() == two.keys()
        for key in one:  # rounding only: the reduction runs in another order
            torch.testing.assert_close(two[key], one[key], rtol=1e-5, atol=1e-5, msg=f"{name}: {key}")


def test_attention_transfer_under_fsdp_equals_one_process(sharded):
    """The align stage's loss under FSDP2 (each converted attention read inside the student's forward, where its
    sharded weights are gathered) trains to the weights of one process calling each attention directly, and on
    one process the two ways of reading the attention agree."""
    tmp_path = sharded
    for name, options in align_fsdp_worker.CASES.items():
        direct = load_file(tmp_path / f"{name}-1-direct.safetensors")
        for other in (f"{name}-1-through", f"{name}-2-fsdp"):
            trained = load_file(tmp_path / f"{other}.safetensors")
            assert trained.keys() == direct.keys()
            for key in direct:  # rounding only: the reduction runs in another order
                torch.testing.assert_close(trained[key], direct[key], rtol=1e-5, atol=1e-5, msg=f"{other}: {key}")
        torch.manual_seed(0)
        start = t2r.convert(tiny_source("llama"), name.removeprefix("hybrid-"), **options).state_dict()
        assert any(not torch.equal(start[k], direct[k]) for k in direct if "self_attn" in k), name  # it trained

def test_the_fused_kl_under_fsdp_equals_the_plain_kl_of_one_process(sharded):
    """The fused KL reads the output head's weight outside the head's forward: under FSDP2, gathered (accelerate's
    wrapping keeps the head's unit gathered after the forward) or gathered by the loss (a unit resharded after its
    forward), it trains to the weights of one unsharded process on whole logits."""
    plain = load_file(sharded / "kl-plain-1.safetensors")
    start = t2r.convert(tiny_source("llama"), "gla").state_dict()
    assert max((plain[k] - start[k]).abs().max().item() for k in plain) > 1e-3  # it trained
    for case in kl_fsdp_worker.CASES:
        fused = load_file(sharded / f"kl-{case}-2.safetensors")
        assert fused.keys() == plain.keys()
        for key in plain:  # rounding only: chunked sums and another reduction order
            torch.testing.assert_close(fused[key], plain[key], rtol=1e-5, atol=1e-5, msg=f"{case}: {key}")


def test_ram_efficient_loading_reads_weights_on_the_main_process_only(tmp_path, source_dir, corpus):
    """With accelerate's fsdp_cpu_ram_efficient_loading, transformers leaves the other ranks without weights
    (zeros, for accelerate to broadcast into the prepared model): what t2r measures on the weights before that
    (the auto:N layer ranking) must come from the main process, and the teacher, which accelerate does not
    prepare, must be sent to the others."""
    import json

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd(), "ACCELERATE_USE_FSDP": "true",
           "FSDP_CPU_RAM_EFFICIENT_LOADING": "true"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           "-m", "tests.train.ram_efficient_worker", str(tmp_path), str(source_dir), str(corpus)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        pytest.fail(torchrun_failure(done.stderr))
    main, other = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert main["student_reused_abs_sum"] > 0 and other["student_reused_abs_sum"] == 0  # rank 1 read no weights
    assert main["mixers"] == other["mixers"] and main["mixers"].count("softmax") == 1
    assert other["teacher_sum"] == main["teacher_sum"] != 0
