"""How data-parallel processes average their gradients (`train.gradient_sync`: fp32 or bf16). Under DDP its
all-reduce does it, bucket by bucket during the backward; bf16 puts `bf16_mean_hook` on it (half the bytes on the
wire). A loss outside the wrapped model's forward (attention MSE, which DDP's hooks never see) averages by hand
with `average_gradients`, in the same precision.

No `from __future__ import annotations` here: DDP compares a hook's return annotation with the type itself."""

import torch
import torch.distributed as dist


def bf16_mean_hook(process_group, bucket) -> torch.futures.Future[torch.Tensor]:
    """A DDP communication hook: the bucket divided by the process count, rounded to bf16, summed over processes,
    written back in the bucket's dtype. torch's own `bf16_compress_hook` does the same but is refused (by its name)
    without CUDA and NCCL, so gloo runs on CPUs could not test it."""
    group = process_group if process_group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    wire = buffer.to(torch.bfloat16).div_(dist.get_world_size(group))
    future = dist.all_reduce(wire, group=group, async_op=True).get_future()

    def written_back(done):
        buffer.copy_(done.value()[0])
        return buffer

    return future.then(written_back)


def use_gradient_sync(model, precision: str) -> None:
    """Puts `precision`'s hook on `model` where it is wrapped in DDP (one process, FSDP: nothing to do)."""
    if precision == "bf16" and isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model.register_comm_hook(None, bf16_mean_hook)


def average_gradients(accelerator, params, precision: str = "fp32", bucket_bytes: int = 1 << 28) -> None:
    """The mean of each gradient over processes, for a loss outside the model's forward (no DDP hooks): the
    gradients of one dtype flattened into buckets of about `bucket_bytes`, one all-reduce each (one a parameter
    was hundreds of small calls a step), in bf16 where `precision` (`train.gradient_sync`) says so."""
    by_dtype: dict[torch.dtype, list] = {}
    for p in params:
        if p.grad is not None:
            by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
    for grads in by_dtype.values():
        bucket, size = [], 0
        for i, grad in enumerate(grads):
            bucket.append(grad)
            size += grad.numel() * grad.element_size()
            if size >= bucket_bytes or i == len(grads) - 1:
                flat = torch._utils._flatten_dense_tensors(bucket)
                wire = flat.to(torch.bfloat16) if precision == "bf16" else flat
                mean = accelerator.reduce(wire, "mean").to(flat.dtype)
                for grad, synced in zip(bucket, torch._utils._unflatten_dense_tensors(mean, bucket)):
                    grad.copy_(synced)
                bucket, size = [], 0
