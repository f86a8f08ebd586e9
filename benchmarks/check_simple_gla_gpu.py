"""GPU probe: simple-GLA scalar-gate kernels at the shapes that failed on H100 (H=1, small V),
under a few dq/dk kernel configs, and the fallback through the GLA kernels."""
import sys

import torch

sys.path.insert(0, "tests/ops")
import test_triton_simple_gla as ts  # noqa: E402

from t2r.ops.gla import triton_chunk as tc  # noqa: E402

mod = sys.modules[ts.chunk_fn.__module__]
cases = [((1, 64, 1, 1, 16, 16), torch.float32), ((1, 150, 3, 1, 64, 32), torch.float32),
         ((2, 300, 2, 1, 128, 128), torch.bfloat16), ((2, 300, 4, 2, 128, 32), torch.bfloat16),
         ((1, 64, 1, 1, 16, 16), torch.bfloat16), ((1, 150, 3, 1, 64, 32), torch.bfloat16)]
variants = [("scalar dqk (8,1)", True, (8, 1)), ("scalar dqk (4,1)", True, (4, 1)),
            ("scalar dqk (4,2)", True, (4, 2)), ("fallback via gla", False, (8, 1))]
mod._scalar_kernel_ok = lambda q, v: mod.SCALAR_KERNEL  # probe the scalar kernels everywhere
for name, scalar, cfg in variants[int(sys.argv[1]):int(sys.argv[1]) + 1]:
    mod.SCALAR_KERNEL = scalar
    tc.CONFIGS["bwd_dqk"] = cfg
    for shape, dt in cases:
        d = ts.make(*shape, kind="moderate")
        try:
            out = ts.run(ts.chunk_fn, d, dt)
            ref = ts.run(ts.naive_fn, d, torch.float32)
            errs = {k: round(ts.rel(out[k], ref[k]), 5) for k in ("o", "dq", "dk", "dv", "dg")}
            torch.cuda.synchronize()
            print(name, shape, dt, errs, flush=True)
        except Exception as e:  # noqa: BLE001
            print(name, shape, dt, "EXC", type(e).__name__, str(e)[:80], flush=True)
            sys.exit(1)
