"""The all-reduce a data-parallel step pays, measured alone: NCCL between the GPUs of one host, by message size and
dtype, as the bandwidth NCCL's own tests report (bus bandwidth: 2 (n - 1) / n x bytes / time), and a model's
gradients reduced the way DDP does (buckets of 25 MiB) against one flat message.

    torchrun --nproc-per-node 2 benchmarks/bench_allreduce.py [--params 134675916] [--sizes-mib 1,4,25,100,512]
    NCCL_DEBUG=INFO torchrun ...     # NCCL's choice of transport (P2P/NVLink, SHM, NET) and protocol in the log

Prints one markdown table from rank 0. A two-H100 profile of the frontier student showed DDP's all-reduce at 72 ms a
step (`ncclDevKernel_AllReduce_Sum_f32_RING_LL`), most of the gap to twice one card: this says whether the link or
the way the gradients are sent is the limit.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist

BUCKET_MIB = 25  # DDP's default bucket_cap_mb


def timed(fn, repeats: int) -> float:
    """Median seconds of `fn` over `repeats` runs, after two warm-up runs, synchronised on every rank."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        dist.barrier()
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes-mib", default="1,4,25,100,512")
    parser.add_argument("--params", type=int, default=134_675_916, help="a model's gradient count (SmolLM2-135M)")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    world = dist.get_world_size()
    factor = 2 * (world - 1) / world
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for mib in (float(s) for s in args.sizes_mib.split(",")):
            x = torch.ones(int(mib * 2**20) // dtype.itemsize, dtype=dtype, device="cuda")
            seconds = timed(lambda: dist.all_reduce(x), args.repeats)
            rows.append((f"one message of {mib:g} MiB", str(dtype).removeprefix("torch."), seconds,
                         factor * x.numel() * dtype.itemsize / seconds / 1e9))
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        grads = torch.ones(args.params, dtype=dtype, device="cuda")
        per_bucket = BUCKET_MIB * 2**20 // dtype.itemsize
        buckets = list(grads.split(per_bucket))
        seconds = timed(lambda: [dist.all_reduce(b) for b in buckets], args.repeats)
        rows.append((f"{args.params:,} gradients in {len(buckets)} buckets of {BUCKET_MIB} MiB", name, seconds,
                     factor * grads.numel() * dtype.itemsize / seconds / 1e9))
        seconds = timed(lambda: dist.all_reduce(grads), args.repeats)
        rows.append((f"{args.params:,} gradients as one message", name, seconds,
                     factor * grads.numel() * dtype.itemsize / seconds / 1e9))
    if rank == 0:
        print(f"{world} x {torch.cuda.get_device_name()}; torch {torch.__version__}; NCCL "
              f"{'.'.join(map(str, torch.cuda.nccl.version()))}")
        print("| all-reduce | dtype | ms (median) | bus bandwidth GB/s |\n|---|---|---|---|")
        for what, dtype, seconds, bandwidth in rows:
            print(f"| {what} | {dtype} | {seconds * 1e3:.2f} | {bandwidth:.1f} |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
