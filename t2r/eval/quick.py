"""The quick look: with `limit` set, every suite shrinks to what answers in about two minutes on 2 CPU cores for
a SmolLM2-sized model (135M parameters), and the report says what was cut.

`limit` caps the counts (perplexity rows, prompts per recall cell, lm-eval documents per task) and the shapes:
perplexity rows and passkey prompts of at most `QUICK_LENGTH` tokens, one window baseline (the largest that fits;
the memory-matched window is always added), the two smallest MQAR cells, one passkey depth (the shallowest: the
needle farthest back, the cell a window loses and a memory must keep; the depths nearer the end are inside every
window and said little in a quick look), bench contexts up to 1K timed once. A forward of SmolLM2 over 512
tokens takes about 1.4 s on 2 idle cores, so the quick look's ~40 forwards of up to 512 tokens (and 64 short
MQAR prompts) answer in under two minutes; what each suite costs is in `t2r eval --help` (`COSTS`). A second
quick look of another student of the same source reads the source's and the fixed window's scores from the
cache (`--cache`, on by default) and scores only the student and its memory-matched window.
"""

from __future__ import annotations

from dataclasses import replace

QUICK_LENGTH = 512
"""Longest perplexity row and passkey prompt of a quick look (tokens)."""
QUICK_BENCH = 1024
"""Longest bench context of a quick look (tokens)."""
COSTS = (
    "cost for SmolLM2-135M converted (the model, its source and the window baselines), fp32 on 2 CPU cores: the "
    "defaults about 18 minutes (ppl ~4.5 min, mqar ~1 min, passkey ~13 min: 4K-token prompts of 9 models); "
    "--limit 8 under 2 minutes idle (ppl ~1 min, mqar ~25 s, passkey ~10 s; 183 s of one core's CPU time, "
    "measured on a busy machine). "
    "On one H100 (bf16, --batch-size 8): ppl of 64 rows x 2K 5-10 s, mqar 7-12 s, passkey up to 8K 2-6 s, 4 "
    "lm-eval tasks of 500 documents 30-50 s per model. A second run reads the source's and windows' scores from "
    "the cache (--cache).")


_USED_BY = {"ppl_rows": ("ppl",), "ppl_length": ("ppl",), "windows": ("ppl", "mqar", "passkey"),
            "mqar_pairs": ("mqar",), "mqar_prompts": ("mqar",), "passkey_lengths": ("passkey",),
            "passkey_depths": ("passkey",), "passkey_prompts": ("passkey",), "bench_contexts": ("bench",),
            "bench_repeats": ("bench",)}
"""The suites each cut setting shapes (a cut of a suite not run is not reported)."""


def _fitting(windows: list[int], sinks: int, length: int) -> list[int]:
    """The largest window that fits `length` with its sinks (none when none fits)."""
    fits = sorted(w for w in windows if w + sinks < length)
    return fits[-1:]


def shrink(settings):
    """(the settings to measure, one line per cut such as `passkey_lengths 512,1024,2048,4096 -> 512,1024`):
    `settings` itself and no lines when `limit` is unset."""
    n = settings.limit
    if n is None:
        return settings, []
    s = settings
    length = min(s.ppl_length, QUICK_LENGTH)
    wanted = {
        "ppl_rows": min(s.ppl_rows, n), "ppl_length": length, "windows": _fitting(s.windows, s.sinks, length),
        "mqar_pairs": sorted(s.mqar_pairs)[:2], "mqar_prompts": min(s.mqar_prompts, n),
        "passkey_lengths": [x for x in s.passkey_lengths if x <= QUICK_LENGTH] or [min(s.passkey_lengths)],
        "passkey_depths": [min(s.passkey_depths)], "passkey_prompts": min(s.passkey_prompts, n),
        "lm_eval_limit": min(s.lm_eval_limit or n, n),
        "bench_contexts": [x for x in s.bench_contexts if x <= QUICK_BENCH] or [min(s.bench_contexts)],
        "bench_repeats": 1,
    }
    wanted = {k: v for k, v in wanted.items() if any(suite in s.suites for suite in _USED_BY.get(k, ()))
              or (k == "lm_eval_limit" and s.harness_asked())}
    cuts = {k: v for k, v in wanted.items() if v != getattr(s, k)}
    lines = [f"{k} {_text(getattr(s, k))} -> {_text(v)}" for k, v in cuts.items()]
    return replace(s, **cuts), lines


def _text(value) -> str:
    if isinstance(value, list):
        return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value) or "none"
    return "all" if value is None else str(value)
