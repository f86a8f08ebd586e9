"""Run by `test_fsdp.py` under torchrun (2 CPU processes, gloo): the attention-transfer loss (`attention_mse`) on
converted tiny models wrapped by torch's `fully_shard` per decoder layer, which gathers a layer's weights only in
the wrapped model's forward (the loss then reads each converted attention inside the student's own forward);
with one process, the same steps on the whole global batch, unsharded, calling each attention directly or through
the forward (`sys.argv[2]`), as references."""

import copy
import sys
from functools import partial

import torch
import torch.distributed as dist
from safetensors.torch import save_file

import t2r
from t2r.train.transfer import AttentionTargets, shard_apart
from tests.helpers.models import tiny_source
from tests.train.fsdp_worker import full_state, global_batches, joined

CASES = {"gla": {}, "hybrid-gsa": dict(num_slots=4, layers=[0, 2])}


def main(out_dir: str, mode: str = "direct", leave: bool = True) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    distributed, rank, world = joined()
    ids = global_batches()
    for name, options in CASES.items():
        torch.manual_seed(0)
        source = tiny_source("llama")
        teacher = copy.deepcopy(source).eval().requires_grad_(False)
        model = t2r.convert(source, name.removeprefix("hybrid-"), **options).train()
        targets = AttentionTargets(model, teacher, through_forward=distributed or mode == "through")
        if distributed:  # as accelerate wraps: the classes `_no_split_modules` names, bottom-up, then the root
            shard_apart(model)
            mesh = init_device_mesh("cpu", (world,))
            for module in reversed(list(model.modules())[1:]):
                if type(module).__name__ in model._no_split_modules:
                    fully_shard(module, mesh=mesh)
            fully_shard(model, mesh=mesh)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        rows = ids.shape[1] // world
        for step in range(ids.shape[0]):
            batch = ids[step, rank * rows:(rank + 1) * rows]
            with torch.no_grad():
                teacher(batch, use_cache=False)  # fills the targets' hooks
            targets.mse(partial(model, batch, use_cache=False)).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        targets.close()
        state = full_state(model)
        if rank == 0:
            save_file(state, f"{out_dir}/{name}-{world}-{'fsdp' if distributed else mode}.safetensors")
    if distributed and leave:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:3])
