"""Run by test_optim.py under torchrun (two gloo processes): `build_optimizer`'s fused AdamW over FSDP2's sharded
parameters (DTensors) steps as the default AdamW over whole ones. Prints the largest weight difference on rank 0."""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

from t2r.optim import build_optimizer


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    whole = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 4))
    sharded = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 4))
    sharded.load_state_dict(whole.state_dict())
    for layer in sharded:
        fully_shard(layer)
    fully_shard(sharded)
    # fused as on CUDA (torch's fused AdamW has a CPU kernel too)
    optimizer = build_optimizer(sharded.parameters(), 1e-2, weight_decay=0.1, device="cuda")
    assert optimizer.defaults["fused"]
    reference = build_optimizer(whole.parameters(), 1e-2, weight_decay=0.1)
    x = torch.randn(8, 16)
    for _ in range(3):
        for model, step in ((sharded, optimizer), (whole, reference)):
            model(x).square().sum().backward()
            step.step()
            step.zero_grad()
    gathered = {name: value.full_tensor() for name, value in sharded.state_dict().items()}
    difference = max((gathered[name] - value).abs().max().item() for name, value in whole.state_dict().items())
    if dist.get_rank() == 0:
        print(f"{type(next(sharded.parameters())).__name__} {difference}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
