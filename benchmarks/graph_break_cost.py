"""Host cost of one torch.compile graph break per layer, as t2r's opaque Triton ops make.

A tiny Llama (30 layers, 16 tokens: the arithmetic is negligible, so a step's time is host time), compiled per
decoder layer as `bench_train.py --modes compiled` does, with its attention call (SDPA) plain, wrapped in
`torch.compiler.disable` (a graph break, as t2r's Triton entry points are today), or registered as a
`torch.library` custom op (opaque to inductor without a break; its backward recomputes the forward, as a
custom op whose saved tensors are not declared would, in plain math); eager rows for reference. Each variant runs
in its own process, several times; the table gives the median step (forward + backward, no optimizer) of each run.

    python benchmarks/graph_break_cost.py            # 3 runs of each variant
    python benchmarks/graph_break_cost.py --runs 5
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import torch  # at module scope: the custom op's annotations are resolved here

VARIANTS = ("eager", "eager, opaque attention", "compiled", "compiled, opaque attention",
            "compiled, attention as a custom op")


def sdpa_as_custom_op(sdpa):
    """Causal, unmasked SDPA as the custom op `graph_break_cost::sdpa` (other calls go to `sdpa` itself)."""
    @torch.library.custom_op("graph_break_cost::sdpa", mutates_args=())
    def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        return sdpa(q, k, v, scale=scale, is_causal=True, enable_gqa=True).contiguous()

    @torch.library.custom_op("graph_break_cost::sdpa_backward", mutates_args=())
    def backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
                    scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        group = q.shape[1] // k.shape[1]                       # [B, heads, T, D]; kv heads shared (GQA)
        kr, vr = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        causal = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
        p = (q @ kr.transpose(-1, -2) * scale).masked_fill(~causal, float("-inf")).softmax(-1)
        dp = do @ vr.transpose(-1, -2)
        ds = p * (dp - (dp * p).sum(-1, keepdim=True))
        dq, dk, dv = ds @ kr * scale, ds.transpose(-1, -2) @ q * scale, p.transpose(-1, -2) @ do
        fold = k.shape[:2] + (group,) + k.shape[2:]
        grads = dq, dk.view(fold).sum(2), dv.view(v.shape[:2] + (group,) + v.shape[2:]).sum(2)
        return tuple(t.contiguous() for t in grads)                # as the fake says

    forward.register_fake(lambda q, k, v, scale: q.new_empty(q.shape[:-1] + v.shape[-1:]))
    backward_op.register_fake(lambda q, k, v, do, scale: (q.new_empty(q.shape), k.new_empty(k.shape),
                                                          v.new_empty(v.shape)))

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:3])
        ctx.scale = inputs[3]

    forward.register_autograd(lambda ctx, do: (*backward_op(*ctx.saved_tensors, do, ctx.scale), None),
                              setup_context=setup_context)

    def call(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if attn_mask is not None or dropout_p or not is_causal:
            return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                        enable_gqa=enable_gqa)
        q, k, v = (t.contiguous() for t in (q, k, v))  # one layout at trace and run time
        return forward(q, k, v, q.shape[-1] ** -0.5 if scale is None else scale)
    return call


def child(variant: str, steps: int = 30, warmup: int = 10) -> None:
    import torch._dynamo.utils
    import torch.nn.functional as F
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(1)
    if "opaque" in variant:  # what transformers' sdpa_attention_forward calls, behind a compile barrier
        F.scaled_dot_product_attention = torch.compiler.disable(F.scaled_dot_product_attention)
    if "custom op" in variant:
        F.scaled_dot_product_attention = sdpa_as_custom_op(F.scaled_dot_product_attention)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=30,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, attn_implementation="sdpa")
    model = LlamaForCausalLM(config)
    if variant.startswith("compiled"):
        for layer in model.model.layers:
            layer.compile(dynamic=False)
    ids = torch.randint(0, config.vocab_size, (1, 16))
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
    print(f"{statistics.median(times) * 1e3:.3f} {breaks}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child)
    rows = []
    for variant in VARIANTS:
        results = [subprocess.run([sys.executable, __file__, "--child", variant], capture_output=True, text=True,
                                  check=True).stdout.split() for _ in range(args.runs)]
        ms = [float(r[0]) for r in results]
        runs = ", ".join(f"{m:.2f}" for m in ms)
        rows.append(f"| {variant} | {statistics.median(ms):.2f} | {runs} | {results[0][1]} |")
        print(rows[-1], flush=True)
    print(f"\ntorch {torch.__version__}, 1 thread; 30 layers x 16 tokens, forward + backward\n")
    print("| variant | ms per step (median of runs) | runs | distinct graph breaks |\n|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
