"""Run by `test_fsdp.py` under torchrun (2 CPU processes, gloo): distillation with the fused KL
(`t2r.train.losses.stage_loss(..., fused=True)`: no logits, the output head's weight read by the loss) on a
converted tiny model wrapped as accelerate's FSDP2 wraps it (each decoder layer, the input embedding, the final
norm and output head in one unit kept gathered after the forward, the root: `tail`), and with that unit resharded
after its forward (the loss gathers the head's weight itself: `resharded`); with one process, the plain KL on
whole logits, unsharded, as the reference."""

import contextlib
import copy
import sys

import torch
import torch.distributed as dist
from safetensors.torch import save_file

import t2r
from t2r.train.losses import stage_loss
from t2r.train.recipe import StageSection
from tests.helpers.models import tiny_source
from tests.train.fsdp_worker import full_state, global_batches, joined

CASES = ("tail", "resharded")
STAGE = StageSection("distill", loss={"kl": 0.75, "next_token": 0.25}, temperature=2.0)


def main(out_dir: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    distributed, rank, world = joined()
    ids = global_batches()
    for case in CASES if distributed else ("plain",):
        torch.manual_seed(0)
        source = tiny_source("llama")
        teacher = copy.deepcopy(source).eval().requires_grad_(False)
        model = t2r.convert(source, "gla").train()
        assert model.get_output_embeddings().weight is not model.get_input_embeddings().weight
        if distributed:
            mesh = init_device_mesh("cpu", (world,))
            for layer in model.model.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(model.model.embed_tokens, mesh=mesh)
            fully_shard([model.model.norm, model.lm_head], mesh=mesh, reshard_after_forward=case == "resharded")
            fully_shard(model, mesh=mesh)
        loss = stage_loss(model, teacher, None, STAGE, contextlib.nullcontext, fused=distributed)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        rows = ids.shape[1] // world
        for step in range(ids.shape[0]):
            batch = ids[step, rank * rows:(rank + 1) * rows]
            total, _ = loss({"input_ids": batch, "labels": batch})
            total.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        state = full_state(model)
        if rank == 0:
            save_file(state, f"{out_dir}/kl-{case}-{world}.safetensors")
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
