"""Compile every Triton kernel that one gated delta forward + backward launches, for a GPU target, on a machine
without one; print each kernel's compile time, the size of its TTGIR and PTX, and its registers and stack
(spill) bytes per thread (Triton's bundled cuobjdump).

The real wrapper (chunk_gated_delta_rule_triton) runs on CPU tensors with a stand-in driver that reports the
target (sm_90 by default); each launch compiles and returns without running (its outputs stay garbage), so
the numbers are the first call's compile cost per kernel, at any shape, with a fresh Triton cache. Depends on
Triton 3.6 internals (JITFunction.run, the driver registry); the compile itself is Triton's own.

    python benchmarks/compile_offline.py                          # Mistral layer: HQ=32, H=8, D=128, bf16
    python benchmarks/compile_offline.py --shape 9 3 64 --arch 90 --dtype float32 --T 1
    python benchmarks/compile_offline.py --dump /tmp/gdn           # also write <prefix>_<kernel>.{ttgir,ptx}
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="t2r_compile_offline_")
os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import jit  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


class TargetOnlyDriver:
    """What JITFunction.run asks the driver before compiling: a device, a stream and the target."""

    def __init__(self, arch: int):
        self.target = GPUTarget("cuda", arch, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target

    def get_active_torch_device(self):
        return torch.device("cpu")


def compile_only(report, dump=None):
    """Patch JITFunction.run to compile (warmup) and skip the launch; report(name, seconds, asm) per kernel."""
    run = jit.JITFunction.run

    def compile_and_skip(self, *args, grid, warmup, **kwargs):
        t0 = time.perf_counter()
        kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
        report(self.fn.__name__, time.perf_counter() - t0, kernel.asm)
        if dump:
            for ext in ("ttgir", "ptx"):
                with open(f"{dump}_{self.fn.__name__}.{ext}", "w") as f:
                    f.write(kernel.asm[ext])
        return kernel

    jit.JITFunction.run = compile_and_skip


def resource_usage(cubin: bytes) -> str:
    """`REG:n STACK:m` of a cubin, from the cuobjdump bundled with Triton."""
    import triton
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    found = [re.search(rf"{key}:(\d+)", out) for key in ("REG", "STACK")]
    return " ".join(f"{key.lower()} {m.group(1) if m else '?'}" for key, m in zip(("REG", "STACK"), found))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", type=int, nargs=3, default=(32, 8, 128), metavar=("HQ", "H", "D"))
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--T", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: H100)")
    ap.add_argument("--dump", default=None, help="path prefix for each kernel's TTGIR and PTX")
    args = ap.parse_args()
    driver.set_active(TargetOnlyDriver(args.arch))
    rows = []

    def report(name, seconds, asm):
        rows.append(seconds)
        print(f"{name:20s} {seconds:6.1f} s  ttgir {len(asm['ttgir']):6d} B  ptx {len(asm['ptx']):7d} B  "
              f"{resource_usage(asm['cubin'])}", flush=True)

    compile_only(report, args.dump)
    from t2r.ops.gated_delta.triton_chunk import chunk_gated_delta_rule_triton

    HQ, H, D = args.shape
    B, T, dt = args.B, args.T, getattr(torch, args.dtype)
    q = torch.randn(B, T, HQ, D, dtype=dt, requires_grad=True)
    k = torch.randn(B, T, H, D, dtype=dt, requires_grad=True)
    v = torch.randn(B, T, H, D, dtype=dt, requires_grad=True)
    g = torch.zeros(B, T, H, requires_grad=True)
    beta = torch.zeros(B, T, H, requires_grad=True)
    o, _ = chunk_gated_delta_rule_triton(q, k, v, g, beta)
    o.float().sum().backward()
    print(f"total {sum(rows):.1f} s for {len(rows)} kernels (sm_{args.arch}, HQ={HQ}, H={H}, D={D}, {args.dtype})")


if __name__ == "__main__":
    main()
