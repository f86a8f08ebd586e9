"""Speed and memory of causal LMs (a converted model and its source) over a sweep of contexts and batch sizes.

Each (context, batch) cell times a prefill of random tokens and `decode_tokens` greedy decode steps through the
model's own cache (`T2RCache` for converted models, transformers' `DynamicCache` for sources), then measures the
cache's bytes and the peak memory of the measured region. Works on CPU and CUDA (the model's device).
"""

from __future__ import annotations

import gc
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from t2r.eval.axes import legend, log_axis, spread, style, tokens_text
from t2r.eval.meters import timed, unique_bytes
from t2r.eval.static_bench import measure_static
from t2r.layers import get_mixer

from .settings import parse_sizes  # noqa: F401 (`t2r.eval.bench.parse_sizes`, its old home)

MiB = 2**20


@dataclass
class BenchRow:
    """One (model, context, batch) cell of a sweep; the measurements are None unless `status` is "ok"."""

    model: str
    context: int
    batch: int
    prefill_tokens_per_s: float | None = None
    decode_ms_per_token: float | None = None
    """Median milliseconds of one decode step (one new token for each sequence of the batch)."""
    decode_tokens_per_s: float | None = None
    """batch * 1000 / decode_ms_per_token."""
    cache_bytes: int | None = None
    """Bytes of the generation cache after prefill and decode (see `cache_bytes`)."""
    peak_memory_bytes: int | None = None
    """CUDA: absolute peak allocated (weights included). None on CPU: the growth of resident memory counts what
    the allocator had not held before, not what the cell used (it fell from 517 to 83 MiB as the context grew
    on SmolLM2, 0.4 MiB at 256 tokens), so the CPU tables leave the column out; `cache_bytes` is the memory
    that grows with the context there."""
    weights_bytes: int | None = None
    status: str = "ok"
    """"ok" | "OOM" | "beyond max_position_embeddings" | "error: <message>"."""


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (dict, list, tuple)):
        for value in obj.values() if isinstance(obj, dict) else obj:
            yield from _tensors(value)


def cache_bytes(cache) -> int:
    """Bytes held by a generation cache: every tensor in each of `cache.layers`' attributes (also inside
    dicts, lists and tuples), each storage counted once. Covers `T2RCache` (recurrent states, K/V, FoX gates)
    and transformers' `DynamicCache`."""
    return unique_bytes(t for layer in cache.layers for value in vars(layer).values() for t in _tensors(value))


def weights_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters and buffers (tied weights counted once)."""
    return unique_bytes([*model.parameters(), *model.buffers()])


def _is_oom(error: BaseException) -> bool:
    message = str(error).lower()
    return isinstance(error, torch.cuda.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and ("out of memory" in message or "allocat" in message))


def failure_status(error: BaseException) -> str:
    """A failed cell's status: "OOM", or "error: <type>: <first line of the message>"."""
    first_line = (str(error).strip().splitlines() or [""])[0]
    return "OOM" if _is_oom(error) else f"error: {type(error).__name__}: {first_line[:100]}"


def random_ids(vocab: int, batch: int, context: int, seed: int, device) -> torch.Tensor:
    """[batch, context] token ids in [10, vocab) (past the special tokens) from `seed`, the same for every model."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(10 if vocab > 10 else 0, vocab, (batch, context), generator=generator).to(device)


def has_position_limit(config) -> bool:
    """True for models with softmax (or FoX) layers; all-recurrent converted models have no length limit."""
    mixers = getattr(config, "t2r_mixers", None)
    return not mixers or any(m == "softmax" or not get_mixer(m).constant_memory for m in mixers)


@torch.inference_mode()
def _measure(model, input_ids, decode_tokens: int, warmup: int, repeats: int, row: BenchRow) -> None:
    device = input_ids.device
    batch, context = input_ids.shape
    prefill_s, step_s = [], []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for i in range(warmup + max(repeats, 1)):
        cache = token = None  # the last repeat's cache is not alive during this prefill
        out, seconds = timed(lambda: model(input_ids, use_cache=True, logits_to_keep=1), device)
        prefill_s += [seconds] if i >= warmup else []
        cache, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        del out
        for _ in range(decode_tokens):
            out, seconds = timed(lambda: model(token, past_key_values=cache, use_cache=True), device)
            step_s += [seconds] if i >= warmup else []
            cache, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            del out
    row.prefill_tokens_per_s = batch * context / statistics.median(prefill_s)
    if step_s:
        row.decode_ms_per_token = 1e3 * statistics.median(step_s)
        row.decode_tokens_per_s = batch * 1e3 / row.decode_ms_per_token
    row.cache_bytes = cache_bytes(cache)
    row.peak_memory_bytes = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def bench_model(model, label: str, contexts, batch_sizes, decode_tokens: int = 16, warmup: int = 1,
                repeats: int = 3, vocab_size: int | None = None, seed: int = 0,
                allow_beyond: bool = False, decode: str = "eager") -> list[BenchRow]:
    """Sweep every (context, batch): prefill tokens/s (median of `repeats` after `warmup`), greedy decode
    ms/step (median over the steps of those repeats), cache bytes and peak memory. Inputs are random ids in
    [10, vocab) from `seed`, the same for every model; the prefill keeps only the last position's logits
    (`logits_to_keep=1`, as `generate` does). An OOM gives a row with status "OOM" and the sweep goes
    on; contexts past `max_position_embeddings` of a model with softmax layers are skipped unless `allow_beyond`.
    `decode="static"` decodes on static buffers instead (`t2r.eval.static_bench`: a CUDA graph per step for
    converted fixed-state models, a compiled `StaticCache` forward for sources).
    """
    if decode not in ("eager", "static"):
        raise ValueError(f"decode={decode!r}: choose eager (the model's own cache) or static (static buffers)")

    measure = measure_static if decode == "static" else _measure
    device = next(model.parameters()).device
    vocab = vocab_size or model.config.vocab_size
    limit = getattr(model.config, "max_position_embeddings", None) if has_position_limit(model.config) else None
    weights = weights_bytes(model)
    rows = []
    cells = [(c, b) for c in contexts for b in batch_sizes]
    for context, batch in tqdm(cells, desc=f"bench {label}", disable=None):
        row = BenchRow(label, int(context), int(batch), weights_bytes=weights)
        rows.append(row)
        if limit is not None and context > limit and not allow_beyond:
            row.status = "beyond max_position_embeddings"
            continue
        input_ids = None
        try:  # the inputs too: a batch too large for memory is a row like any other OOM
            input_ids = random_ids(vocab, batch, context, seed, device)
            measure(model, input_ids, decode_tokens, warmup, repeats, row)
        except Exception as error:  # one failing cell must not end the sweep
            first_line = (str(error).strip().splitlines() or [""])[0]
            status = (first_line[:100] if decode == "static" and "static decoding" in first_line and not _is_oom(error)
                      else failure_status(error))
            rows[-1] = row = BenchRow(label, int(context), int(batch), weights_bytes=weights, status=status)
        del input_ids
        if row.status != "ok":  # the failed frames may hold tensors in cycles
            gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def _cell(row: BenchRow | None, peak: bool) -> list[str]:
    width = 4 + peak
    if row is None:
        return [""] * width
    if row.status != "ok":
        return [row.status] + ["-"] * (width - 1)

    def fmt(value, spec):
        return "n/a" if value is None else format(value, spec)
    mib = [None if b is None else b / MiB for b in (row.cache_bytes, row.peak_memory_bytes)]
    return [fmt(row.prefill_tokens_per_s, ",.0f"), fmt(row.decode_ms_per_token, ".2f"),
            fmt(row.decode_tokens_per_s, ",.0f"), fmt(mib[0], ",.2f")] + ([fmt(mib[1], ",.1f")] if peak else [])


CACHE_NOTE = ("cache MiB: the generation cache's tensors after prefill and decode, each storage once (a converted "
              "model's recurrent state, a source's K/V)")
CPU_NOTE = ("no peak MiB on CPU: resident-memory growth counts what the allocator had not held before, not what "
            "a cell used; the cache column is the memory that grows with the context")


def format_table(rows: list[BenchRow]) -> str:
    """Markdown table, one line per (context, batch), each model's columns side by side; `peak MiB` only where
    measured (CUDA), and a note under the table saying what the memory columns hold."""
    labels, cells = list(dict.fromkeys(r.model for r in rows)), {(r.model, r.context, r.batch): r for r in rows}
    peak = any(r.peak_memory_bytes is not None for r in rows)
    metrics = ("prefill tok/s", "decode ms/token", "decode tok/s", "cache MiB") + (("peak MiB",) if peak else ())
    header = ["context", "batch"] + [f"{label} {m}" for label in labels for m in metrics]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for context, batch in sorted({(r.context, r.batch) for r in rows}):
        values = [str(context), str(batch)] + [v for label in labels
                                                for v in _cell(cells.get((label, context, batch)), peak)]
        lines.append("| " + " | ".join(values) + " |")
    notes = CACHE_NOTE + ("; peak MiB: CUDA's peak allocated, weights included" if peak else "; " + CPU_NOTE)
    return "\n".join(lines) + f"\n\n{notes}."


def plot(rows: list[BenchRow], out_dir) -> list[Path]:
    """Write memory_vs_context.png (cache MiB, and peak MiB where measured: CUDA) and decode_vs_context.png
    (decode tokens/s) to `out_dir`, one series per model and batch size (each its own colour, marker and dashes,
    nudged apart on the log axes so equal series stay visible), log-log axes with plain labels; returns the paths."""
    try:
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError("plotting needs matplotlib: pip install matplotlib (or pip install -e .[eval])") from error
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ok = [r for r in rows if r.status == "ok"]
    series = list(dict.fromkeys((r.model, r.batch) for r in ok))
    many_batches = len({b for _, b in series}) > 1

    def draw(ax, attr, scale, ylabel):
        contexts, values = sorted({r.context for r in ok}), []
        for i, (model, batch) in enumerate(series):
            points = sorted((r.context, getattr(r, attr) / scale) for r in ok
                            if (r.model, r.batch) == (model, batch) and getattr(r, attr) is not None)
            if points:
                xs, ys = zip(*points)
                values += ys
                ax.plot(spread(xs, i, len(series)), spread(ys, i, len(series), width=0.03), **style(i),
                        label=f"{model} (batch {batch})" if many_batches else model)
        log_axis(ax.xaxis, contexts, tokens_text, ticks=contexts)
        log_axis(ax.yaxis, values)
        ax.set(xlabel="context (tokens)", ylabel=ylabel)
        ax.grid(True, which="major", alpha=0.3)
        legend(ax, fontsize="small")

    peak = [("peak_memory_bytes", MiB, "peak MiB (CUDA, weights included)")] if any(
        r.peak_memory_bytes is not None for r in ok) else []
    paths = []
    for name, panels in (("memory_vs_context.png", [("cache_bytes", MiB, "generation cache MiB"), *peak]),
                         ("decode_vs_context.png", [("decode_tokens_per_s", 1, "decode tokens/s")])):
        fig = Figure(figsize=(6 * len(panels), 4), layout="constrained")
        for ax, panel in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
            draw(ax, *panel)
        fig.savefig(out_dir / name, dpi=120)
        paths.append(out_dir / name)
    return paths
