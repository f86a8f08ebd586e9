"""Run by test_compile_under_ddp.py: a stack of layers of 2 MB of weights each, compiled by `compile_layers`, two
forwards and backwards; under torchrun wrapped in DDP with 1 MiB buckets (each layer's gradients span buckets).
Prints on rank 0 what AOTAutograd compiled, as JSON: {"graphs": n, "cache_bypassed": n}."""

import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn

from t2r.models.compilation import compile_layers


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(256, 1024), nn.Linear(1024, 256)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(Layer() for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def main() -> None:
    from torch._dynamo.utils import counters

    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = compile_layers(Stack())
    run = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1) if distributed else model
    for _ in range(2):
        run(torch.randn(8, 256)).sum().backward()
    if not distributed or dist.get_rank() == 0:
        print(json.dumps({"graphs": counters["aot_autograd"]["total"],
                          "cache_bypassed": counters["aot_autograd"]["autograd_cache_bypass"]}), flush=True)
    if distributed:  # both done; then out without destroying the group: gloo's destructor, joining its loop
        # thread while holding the GIL that thread waited for, hung one process in ~1 run of 3 here
        dist.barrier()
        os._exit(0)


if __name__ == "__main__":
    main()
