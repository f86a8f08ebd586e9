"""Sliding-window + sink attention, fwd and fwd+bwd: the blocked PyTorch form vs FlexAttention vs full causal SDPA.

    python benchmarks/bench_window.py            # CUDA, bf16; prints a markdown table
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from t2r.ops.window import chunk_window_attention, flex_window_attention

SHAPES = {  # name: B, T, HQ, H, D
    "SmolLM2 8 x 1K": (8, 1024, 9, 3, 64),
    "SmolLM2 4 x 8K": (4, 8192, 9, 3, 64),
    "Mistral-7B layer 4 x 4K": (4, 4096, 32, 8, 128),
}


def timed(fn, backward: bool, repeats: int = 10) -> float:
    def once():
        out = fn()
        if backward:
            out.float().sum().backward()
    for _ in range(3):
        once()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeats):
        once()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--sinks", type=int, default=4)
    args = parser.parse_args()
    print(f"window {args.window}, sinks {args.sinks}, bf16, {torch.cuda.get_device_name()}, ms fwd / fwd+bwd\n")
    print("| shape | blocked PyTorch | FlexAttention | SDPA causal (full) |\n|---|---|---|---|")
    for name, (batch, length, heads_q, heads, dim) in SHAPES.items():
        q = torch.randn(batch, length, heads_q, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k, v = (torch.randn(batch, length, heads, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                for _ in range(2))
        positions = torch.arange(length, device="cuda")[None]
        kwargs = dict(positions=positions, window=args.window, sinks=args.sinks, scale=dim ** -0.5)
        forms = {
            "chunk": lambda: chunk_window_attention(q, k, v, **kwargs),
            "flex": lambda: flex_window_attention(q, k, v, **kwargs),
            "sdpa": lambda: F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                           is_causal=True, enable_gqa=True),
        }
        cells = []
        for form in forms.values():
            try:
                cells.append(f"{timed(form, False):.2f} / {timed(form, True):.2f}")
            except torch.OutOfMemoryError:
                cells.append("out of memory")
            torch.cuda.empty_cache()
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
