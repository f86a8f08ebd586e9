"""gdn's gradients in bf16 through PyTorch and through the Triton kernels, each against the fp32 model (GPU):
which backend a gate-bias gradient's error comes from. A tiny converted Llama and Gemma 3, 2 x 200 tokens.

    python benchmarks/check_gdn_grads_gpu.py
"""

import copy
import os

import torch

import t2r
from tests.helpers.models import tiny_source

WATCHED = ("beta", "dt_bias", "A_log", "q_proj")
RUNS = (("fp32", torch.float32, "torch"), ("torch-bf16", torch.bfloat16, "torch"),
        ("triton-bf16", torch.bfloat16, "triton"))


def relative_error(x, reference) -> float:
    return ((x - reference).norm() / reference.norm().clamp_min(1e-12)).item()


def main() -> None:
    torch.manual_seed(0)
    for arch in ("llama", "gemma3_text"):
        base = t2r.convert(tiny_source(arch, hidden_size=256, num_attention_heads=4, num_key_value_heads=2), "gdn")
        ids = torch.randint(3, 97, (2, 200), device="cuda")
        grads = {}
        for name, dtype, backend in RUNS:
            os.environ["T2R_OPS_BACKEND"] = backend
            model = copy.deepcopy(base).to("cuda", dtype).train()
            model(ids, labels=ids).loss.backward()
            grads[name] = {n: p.grad.float() for n, p in model.named_parameters()
                           if p.grad is not None and any(w in n for w in WATCHED)}
        for n, reference in list(grads["fp32"].items())[:8]:
            print(arch, n, " ".join(f"{run} {relative_error(grads[run][n], reference):.3f}"
                                    for run, _, _ in RUNS[1:]))


if __name__ == "__main__":
    main()
