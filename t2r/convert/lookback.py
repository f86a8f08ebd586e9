"""How far back each attention head of a source model looks: the statistic behind `init="teacher"`.

For query i, head h, the source's softmax weights p_ij give a mean look-back distance sum_j p_ij (i - j). The
first `sinks` keys are left out and the rest renormalised (attention sinks put most of their weight on the first
token whatever the head does), and queries before `2 * sinks` are skipped. The mean over queries and text is the
head's look-back d_h, in tokens.

A decaying state with per-step factor gamma weighs a token k steps back by (1 - gamma) gamma^k, whose mean
distance is gamma / (1 - gamma): `t2r.layers.base.decay_for_lookback` inverts it, gamma = d / (1 + d). Converted
layers set their forget gates' starting decay from it (`ConvertedAttention.init_from_lookback`);
`t2r.convert.calibration.teacher_lookback` measures it on calibration text.
"""

from __future__ import annotations

import torch


@torch.no_grad()
def attention_lookback(source, input_ids: torch.Tensor, sinks: int = 4) -> torch.Tensor:
    """`[layers, query heads]` mean look-back distance of `source`'s attention on `input_ids` `[rows, T]`."""
    previous = source.config._attn_implementation
    source.set_attn_implementation("eager")  # the attention weights are returned only by the eager path
    device = next(source.parameters()).device
    try:
        total = None
        for row in input_ids:
            attentions = source(row[None].to(device), output_attentions=True, use_cache=False).attentions
            length = row.shape[0]
            i = torch.arange(length, device=device)[:, None]
            distance = (i - torch.arange(length, device=device)[None, :]).clamp(min=0).float()
            per_layer = []
            for weights in attentions:  # [1, H, T, T]
                p = weights[0].float()[:, 2 * sinks:, sinks:]
                p = p / p.sum(-1, keepdim=True).clamp(min=1e-9)
                per_layer.append((p * distance[2 * sinks:, sinks:]).sum(-1).mean(-1))
            stats = torch.stack(per_layer).cpu()
            total = stats if total is None else total + stats
        return total / len(input_ids)
    finally:
        source.set_attn_implementation(previous)
