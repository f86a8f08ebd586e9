"""Decode speed on static buffers: converted fixed-state models through `StaticDecoder` (one CUDA graph per
step), sources through transformers' `StaticCache` with the forward compiled (`mode="reduce-overhead"`, CUDA
graphs through inductor; eager on CPU), the path `generate(cache_implementation="static")` takes.

Both remove the framework overhead of eager decoding (about 1 ms per layer on an H100), which otherwise hides
what the recurrent state saves. `bench_model(..., decode="static")` calls `measure_static` per cell.
"""

from __future__ import annotations

import statistics

import torch

from t2r.eval.meters import timed, unique_bytes


@torch.inference_mode()
def measure_static(model, input_ids, decode_tokens: int, warmup: int, repeats: int, row) -> None:
    """Fill `row` (a `BenchRow`): a warm-up prefill, one timed prefill of `input_ids`, `warmup` untimed decode
    steps (graph capture, compilation), then `decode_tokens * repeats` timed steps; the median step time."""
    from t2r.models.static_decode import StaticDecoder, check_static_decodable

    device = input_ids.device
    batch, context = input_ids.shape
    steps = decode_tokens * max(repeats, 1)
    warmup = max(warmup, 2)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    if getattr(model.config, "t2r_mixers", None) is not None:
        check_static_decodable(model)  # a clear error for hybrids, FoX and windowed layers
        decoder = StaticDecoder(model, batch)
        decoder.prefill(input_ids)  # warm-up: kernels compile on the first call
        logits, prefill_s = timed(lambda: decoder.prefill(input_ids), device)
        token = logits.argmax(-1, keepdim=True)

        def step():
            nonlocal token
            token = decoder.step(token).argmax(-1, keepdim=True)

        def state():
            return unique_bytes(b for bufs in decoder.cache.buffers.values() for b in bufs)
    else:
        from transformers import StaticCache

        cache = StaticCache(config=model.config, max_cache_len=context + warmup + steps + 1)
        model(input_ids, past_key_values=cache, use_cache=True, logits_to_keep=1)  # warm-up, as above
        cache.reset()
        out, prefill_s = timed(lambda: model(input_ids, past_key_values=cache, use_cache=True, logits_to_keep=1),
                                device)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        position = torch.full((batch, 1), context, device=device)
        forward = torch.compile(model.__call__, mode="reduce-overhead") if device.type == "cuda" else model.__call__

        def step():
            nonlocal token
            if device.type == "cuda":
                torch.compiler.cudagraph_mark_step_begin()
            logits = forward(input_ids=token, position_ids=position, past_key_values=cache, use_cache=True).logits
            token = logits[:, -1].argmax(-1, keepdim=True).clone()
            position.add_(1)

        def state():
            return unique_bytes(t for layer in cache.layers for t in (layer.keys, layer.values))
    for _ in range(warmup):
        step()
    times = [timed(step, device)[1] for _ in range(steps)]
    row.prefill_tokens_per_s = batch * context / prefill_s
    row.decode_ms_per_token = 1e3 * statistics.median(times)
    row.decode_tokens_per_s = batch * 1e3 / row.decode_ms_per_token
    row.cache_bytes = state()
    row.peak_memory_bytes = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None

