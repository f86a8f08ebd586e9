"""Peak CPU memory of the distillation KL, forward + backward: plain (whole logits, `t2r.train.losses.distill_kl`)
vs chunked and fused with the output projection (`t2r.train.kl.chunked_kl`), at SmolLM2's shapes.

    python benchmarks/kl_memory.py --tokens 4096 --chunk-tokens 1024

Each variant runs in its own process; the figure is its peak resident set (ru_maxrss) minus the resident set
once the inputs exist (student and teacher hidden states and head weights, the teacher's logits for plain),
so it counts what the loss itself allocates. Writes benchmarks/results/kl_memory.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def _resident() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def run_one(mode: str, tokens: int, vocab: int, hidden: int, chunk: int, dtype: str) -> dict:
    import resource

    import torch
    import torch.nn.functional as F

    from t2r.train.kl import chunked_kl
    from t2r.train.losses import distill_kl

    torch.manual_seed(0)
    cast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16")
    h = torch.randn(tokens, hidden, requires_grad=True)
    w = (torch.randn(vocab, hidden) / hidden ** 0.5).requires_grad_(True)
    th = torch.randn(tokens, hidden).to(torch.bfloat16)
    tw = (torch.randn(vocab, hidden) / hidden ** 0.5).to(torch.bfloat16)
    with torch.no_grad():
        teacher_logits = F.linear(th, tw) if mode == "plain" else None  # the teacher's forward, as the loop has it
    before = _resident()
    start = time.perf_counter()
    with cast:
        if mode == "plain":
            loss = distill_kl(F.linear(h, w), teacher_logits, 1.0)
        else:
            loss = chunked_kl(h, w, th, tw, chunk_tokens=chunk)
    loss.backward()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"mode": mode, "loss": loss.item(), "peak_bytes": peak - before, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--chunk-tokens", type=int, default=1024)
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--one", choices=("plain", "chunked"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    shape = (args.tokens, args.vocab, args.hidden, args.chunk_tokens, args.dtype)
    if args.one:
        print(json.dumps(run_one(args.one, *shape)))
        return
    rows = []
    for mode in ("plain", "chunked"):
        out = subprocess.run([sys.executable, __file__, "--one", mode, "--tokens", str(args.tokens), "--vocab",
                              str(args.vocab), "--hidden", str(args.hidden), "--chunk-tokens", str(args.chunk_tokens),
                              "--dtype", args.dtype], check=True, capture_output=True, text=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    fp32_logits = args.tokens * args.vocab * 4
    lines = [f"KL forward + backward, {args.tokens} tokens, vocab {args.vocab}, hidden {args.hidden}, "
             f"{args.dtype} compute, chunk {args.chunk_tokens} tokens (one fp32 copy of the logits: "
             f"{fp32_logits / 2**20:,.0f} MiB)", "",
             "| mode | peak MiB above the inputs | in fp32 logit copies | seconds | loss |", "|---|---|---|---|---|"]
    lines += [f"| {r['mode']} | {r['peak_bytes'] / 2**20:,.0f} | {r['peak_bytes'] / fp32_logits:.2f} | "
              f"{r['seconds']:.2f} | {r['loss']:.6f} |" for r in rows]
    table = "\n".join(lines)
    print(table)
    out = Path(__file__).parent / "results" / "kl_memory.md"
    out.write_text(table + "\n\nCommand: python benchmarks/kl_memory.py " + " ".join(sys.argv[1:]) + "\n")


if __name__ == "__main__":
    main()
