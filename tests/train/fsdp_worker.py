"""Run by `test_fsdp.py` under torchrun (2 CPU processes, gloo): train converted tiny models with torch's
`fully_shard` per decoder layer, and (rank 0) save the gathered weights; with one process, the same steps on the
whole global batch without sharding, as the reference. `python -m tests.train.fsdp_worker DIR align` runs
`align_fsdp_worker` next in the same processes (one launch: each costs ~8 s of imports on 2 cores)."""

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors.torch import save_file

import t2r
from tests.helpers.models import tiny_source

CASES = {"gsa": dict(num_slots=4), "gla": {}, "retnet": {}, "fox": {}, "gdn": {},
         "hybrid-gsa": dict(num_slots=4, layers=[0, 2])}
FLOAT64 = {"gdn"}
"""Cases run in float64: through gdn's L2-normalised q and k, three SGD steps at lr 0.5 amplify the fp32 rounding of
the other reduction order to 1.7e-5 in the embeddings (above the tolerance); in float64 both runs agree to 4e-16."""


def train(model, ids, rank: int, world: int, steps: int = 3) -> None:
    # SGD: an update linear in the gradient (Adam's first steps are +-lr whatever the gradient's size, so a
    # gradient of 1e-12 that rounds to the other sign in another reduction order moves a weight by 2 lr)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    rows = ids.shape[1] // world  # ids: [steps, global batch, tokens]
    for step in range(steps):
        batch = ids[step, rank * rows:(rank + 1) * rows]
        logits = model(batch, use_cache=False).logits[:, :-1]
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())  # mean over this rank's tokens
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def full_state(model) -> dict:
    """The model's weights, gathered where FSDP sharded them, as plain tensors."""
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().contiguous().clone()
            for k, v in model.state_dict().items()}


def joined() -> tuple[bool, int, int]:
    """(under torchrun, rank, world size): the gloo group joined when torchrun started this process."""
    if "RANK" not in __import__("os").environ:
        return False, 0, 1
    if not dist.is_initialized():  # joined already when a second worker runs in the same processes
        dist.init_process_group("gloo")
    return True, dist.get_rank(), dist.get_world_size()


def global_batches() -> torch.Tensor:
    """The token ids of 3 steps x 4 rows x 16 tokens, the same in every process."""
    return torch.randint(3, 97, (3, 4, 16), generator=torch.Generator().manual_seed(0))


def main(out_dir: str, leave: bool = True) -> None:
    """Train every case; under torchrun, leave the process group at the end unless `leave` is False."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    distributed, rank, world = joined()
    ids = global_batches()
    for name, options in CASES.items():
        torch.manual_seed(0)
        target = name.removeprefix("hybrid-")
        model = t2r.convert(tiny_source("llama"), target, **options).train()
        if name in FLOAT64:
            model.double()
        if distributed:  # one CPU mesh over the processes, as accelerate builds per device type
            mesh = init_device_mesh("cpu", (world,))
            for layer in model.model.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
            assert model.model.layers[0].mlp.up_proj.weight.to_local().shape[0] < 96  # really sharded
        train(model, ids, rank, world)
        state = full_state(model)
        if rank == 0:
            save_file(state, f"{out_dir}/{name}-{world}.safetensors")
    if distributed and leave:
        dist.destroy_process_group()


if __name__ == "__main__":
    align = sys.argv[2:] == ["align"]
    main(sys.argv[1], leave=not align)
    if align:  # test_fsdp.py's attention-transfer and fused-KL cases, in the same two processes and process group
        from tests.train import align_fsdp_worker, kl_fsdp_worker

        align_fsdp_worker.main(sys.argv[1], "fsdp", leave=False)
        kl_fsdp_worker.main(sys.argv[1])
