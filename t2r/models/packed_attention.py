"""Softmax attention over packed training batches, without a `[N, N]` mask: varlen FlashAttention.

`collate_packed` lays a micro-batch of rows end to end as one sequence `[1, N]` with `cu_seq_lens_q` marking its
documents. Through transformers' SDPA path such a batch becomes a dense block-diagonal mask over all N tokens
and one masked attention over N x N scores: at 8 x 2048 tokens that is 8x the work of the rows' causal
attention and the largest cost of a distillation step after the window (the teacher's forward 126 ms of GPU
time against 40 ms for the same tokens as rows, `benchmarks/results/profile_distill_*.md`). Inside
`packed_attention(model)`, the model's softmax layers run PyTorch's varlen FlashAttention over the documents
(`torch.nn.attention.varlen`), causal inside each one: the same function, with work linear in the documents'
lengths squared.

For training forwards only: no padding mask and no cache (the layers are then called with a `[N, N]` mask or
cached keys, which this path refuses by name). Elsewhere (CPU, fp32, a torch without varlen attention) the
context leaves the model as it is.
"""

from __future__ import annotations

import contextlib
import functools
import inspect

import torch
import torch.nn.functional as F

NAME = "t2r_packed"
"""The attention implementation's name in transformers' `AttentionInterface`."""


def _find_varlen():
    """(varlen_attn, its parameter names), or None where this torch has none."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn, frozenset(inspect.signature(varlen_attn).parameters)


# looked up once, at import: a cached lookup function called from compiled layers made dynamo warn on every graph
_VARLEN = _find_varlen()


def reference_packed_attention(q, k, v, cu_seqlens, scale: float) -> torch.Tensor:
    """The obvious form: causal SDPA over each document in turn. q `[N, HQ, D]`, k/v `[N, H, D]`."""
    out = torch.empty_like(q)
    for start, end in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist()):
        if end > start:
            piece = F.scaled_dot_product_attention(q[start:end].transpose(0, 1), k[start:end].transpose(0, 1),
                                                   v[start:end].transpose(0, 1), is_causal=True, scale=scale,
                                                   enable_gqa=True)
            out[start:end] = piece.transpose(0, 1)
    return out


def can_run(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the varlen kernels take queries of this device and dtype (CUDA, bf16 / fp16, a torch that has
    them)."""
    return device.type == "cuda" and dtype in (torch.bfloat16, torch.float16) and _VARLEN is not None


def packed_causal_attention(q, k, v, cu_seqlens, max_length: int, scale: float) -> torch.Tensor:
    """Causal softmax attention inside each document of a packed sequence: q `[N, HQ, D]`, k/v `[N, H, D]`,
    cu_seqlens `[docs + 1]` (int, starts then N), max_length the longest document -> `[N, HQ, D]`."""
    if not can_run(q.device, q.dtype):
        return reference_packed_attention(q, k, v, cu_seqlens, scale)
    varlen_attn, params = _VARLEN
    kwargs = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    if "scale" in params:
        kwargs["scale"] = scale
    elif abs(scale - q.shape[-1] ** -0.5) > 1e-12:  # an older torch: its varlen attention has no scale argument
        q = q * (scale * q.shape[-1] ** 0.5)
    group = q.shape[1] // k.shape[1]
    if group > 1 and "enable_gqa" in params:
        kwargs["enable_gqa"] = True
    elif group > 1:
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    cu = cu_seqlens.to(device=q.device, dtype=torch.int32)
    return varlen_attn(q, k, v, cu, cu, int(max_length), int(max_length), **kwargs)


def attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """transformers' attention interface: query `[B, HQ, T, D]`, key/value `[B, H, T, D]` -> (`[B, T, HQ, D]`,
    None). Documents from `cu_seq_lens_q` (a packed batch, B = 1), else each row is one document."""
    batch, heads, length, dim = query.shape
    if attention_mask is not None or key.shape[2] != length:
        raise ValueError(f"attention implementation {NAME!r} is for packed training forwards: it takes no padding "
                         "mask and no cache; leave `t2r.models.packed_attention.packed_attention` around them only")
    if dropout:
        raise ValueError(f"attention implementation {NAME!r} has no dropout (attention_dropout={dropout})")
    cu_seqlens, max_length = kwargs.get("cu_seq_lens_q"), kwargs.get("max_length_q")
    if cu_seqlens is None or batch != 1:
        cu_seqlens = torch.arange(0, (batch + 1) * length, length, device=query.device, dtype=torch.int32)
        max_length = length
    scale = dim ** -0.5 if scaling is None else scaling
    flat = [t.transpose(1, 2).reshape(batch * length, t.shape[1], dim) for t in (query, key, value)]
    device = query.device.type
    if torch.is_autocast_enabled(device):  # as autocast casts SDPA's inputs (RoPE in an fp32 stream gives fp32 q, k)
        flat = [t.to(torch.get_autocast_dtype(device)) for t in flat]
    out = packed_causal_attention(*flat, cu_seqlens, max_length, scale)
    return out.view(batch, length, heads, dim), None


@functools.lru_cache(maxsize=1)
def register() -> str:
    """Register the implementation with transformers (once); returns its name. No mask function is registered:
    transformers then builds no mask for it."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, attention_forward)
    return NAME


def _config(model):
    while hasattr(model, "module"):  # DDP, compiled wrappers
        model = model.module
    return getattr(model, "config", None)


@contextlib.contextmanager
def packed_attention(*models, device: torch.device | str | None = None):
    """Inside, the softmax layers of `models` whose attention is SDPA or eager run `packed_causal_attention`,
    when `device` (default: the first model's parameters') is CUDA and this torch has varlen attention."""
    models = [m for m in models if m is not None]
    first = next((p for m in models for p in m.parameters()), None)
    device = torch.device(device) if device is not None else (first.device if first is not None else None)
    configs = [c for c in (_config(m) for m in models)
               if c is not None and getattr(c, "_attn_implementation", None) in ("sdpa", "eager")]
    if device is None or not can_run(device, torch.bfloat16) or not configs:
        yield
        return
    name = register()
    saved = [(c, c._attn_implementation) for c in configs]
    try:
        for config, _ in saved:
            config._attn_implementation = name
        yield
    finally:
        for config, implementation in saved:
            config._attn_implementation = implementation
