"""Calibrated conversion: what `convert` needs measured on the source first, on sample text, then the conversion.

Two settings are measured rather than given: `layers="auto:N"` (the N layers most sensitive to conversion stay
softmax, `t2r.convert.sensitivity`) and `init="teacher"` (each new forget gate starts at the decay matching how
far back its source head looks, `t2r.convert.lookback`). `calibrated_convert` is the one composition of both
with `convert`, used by `t2r convert` and by training.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Callable

import torch

from t2r.convert.conversion import convert
from t2r.convert.layer_spec import auto_softmax_count, parse_layers
from t2r.convert.lookback import attention_lookback
from t2r.convert.sensitivity import LayerRanking, rank_layers
from t2r.convert.settings import CONVERT_DEFAULTS, ConvertSettings
from t2r.data.config import DataConfig
from t2r.data.recall_prompts import answer_rows, mqar_examples
from t2r.data.rows import token_rows
from t2r.layers.registry import get_mixer, teacher_init_refusal

ROWS, LENGTH = CONVERT_DEFAULTS["calibration_rows"], CONVERT_DEFAULTS["calibration_length"]
RANK_BY, RANK_SWEEP = CONVERT_DEFAULTS["rank_by"], CONVERT_DEFAULTS["rank_sweep"]


def calibration_rows(tokenizer, data: DataConfig | None = None, rows: int = ROWS, length: int = LENGTH,
                     seed: int = 0) -> torch.Tensor:
    """`[rows, length]` token ids to measure on: documents of `data` (its training part) joined end to end, or,
    without data, generated long documents (`t2r.data.synthetic`)."""
    if data is None:
        with tempfile.TemporaryDirectory() as tmp:
            from t2r.data.synthetic import write_long_jsonl  # here: `python -m t2r.data.synthetic` imports t2r

            path = write_long_jsonl(Path(tmp) / "calibration.jsonl", count=rows, seed=20_000 + seed)
            return token_rows(DataConfig(path=str(path)), tokenizer, length, rows, seed, pack=True, part="train")
    return token_rows(data, tokenizer, length, rows, seed, pack=True, part="train")


RECALL_PAIRS = 64
"""MQAR pairs of the recall prompts a ranking measures on: about 520 tokens, most answers far beyond a short
window."""


def recall_rows(tokenizer, rows: int = ROWS, pairs: int = RECALL_PAIRS, seed: int = 0):
    """`(ids, answer mask)` of `rows` MQAR prompts of `pairs` pairs (seeded apart from the evaluation's prompts)."""
    return answer_rows(mqar_examples(tokenizer, pairs, rows, seed=10_000 + seed))


def resolve_layers(spec, source, tokenizer, target: str, data: DataConfig | None = None, rows: int = ROWS,
                   length: int = LENGTH, out_dir: str | Path | None = None, progress: bool = True,
                   rank_by: str = RANK_BY, rank_sweep: str = RANK_SWEEP, **options):
    """`layers` for `convert`: `spec` itself, or for `auto:N` the layers left after keeping the N most
    sensitive as softmax (ranked on `calibration_rows`, and on `recall_rows` unless `rank_by` is `kl`, by the
    `rank_sweep` of `t2r.convert.sensitivity`;
    ranking.json / ranking.png written to `out_dir`, and read back from there when present, so a resumed run
    converts the same layers)."""
    count = auto_softmax_count(spec)
    if count is None:
        return spec
    layers = source.config.num_hidden_layers
    if count >= layers:
        raise ValueError(f"layers={spec!r}: keep between 0 and {layers - 1} of {layers} layers as softmax "
                         "(at least one layer must be converted)")
    calibration = {"data": getattr(data, "path", None), "rows": rows, "length": length}
    if rank_by != "kl":
        calibration["recall_pairs"] = RECALL_PAIRS
    if rank_sweep != RANK_SWEEP:
        calibration["sweep"] = rank_sweep
    saved = Path(out_dir) / "ranking.json" if out_dir is not None else None
    if saved is not None and saved.is_file():
        stored = json.loads(saved.read_text())
        if (stored.get("target"), stored.get("calibration"), len(stored["kl"]), stored.get("criterion", "kl")) == (
                target, calibration, layers, rank_by):
            return LayerRanking(target, stored["kl"], stored["tokens"], stored["options"], recall=stored.get("recall"),
                                criterion=rank_by, sweep=rank_sweep).converted_layers(count)
    ids = calibration_rows(tokenizer, data, rows, length)
    recall = recall_rows(tokenizer, rows) if rank_by != "kl" else None
    ranking = rank_layers(source, target, ids, progress=progress, recall=recall, criterion=rank_by, sweep=rank_sweep,
                          **options)
    ranking.calibration = calibration
    if out_dir is not None:
        ranking.write(out_dir, count)
    return ranking.converted_layers(count)


def teacher_lookback(source, tokenizer, data: DataConfig | None = None, rows: int = ROWS,
                     length: int = LENGTH) -> torch.Tensor:
    """`attention_lookback` on `calibration_rows` (`data`'s training documents, or generated ones)."""
    return attention_lookback(source, calibration_rows(tokenizer, data, rows, length))


def calibrated_convert(model, tokenizer, target: str, *, layers=CONVERT_DEFAULTS["layers"],
                       init: str = CONVERT_DEFAULTS["init"], data: DataConfig | None = None, rows: int = ROWS,
                       length: int = LENGTH, ranking_dir: str | Path | None = None, measure: Callable | None = None,
                       source: str | None = None, copy: bool = True, rank_by: str = RANK_BY,
                       rank_sweep: str = RANK_SWEEP, kept_window: int | None = None, **options):
    """`convert(model, target, ...)` after measuring on `model` (the source) what the settings ask for; the
    keyword defaults are those of `t2r.convert.settings.ConvertSettings`, which checks them.

    Args:
        layers: a layer spec (`t2r.convert.layer_spec`); for `auto:N` the layers are ranked first
            (`resolve_layers`, by `rank_by` and `rank_sweep`, `t2r.convert.sensitivity`; the ranking is written
            to, and reused from, `ranking_dir`).
        init: `default`, or `teacher`: the new forget gates start from the source's look-back (`teacher_lookback`).
        data, rows, length: the text measured on (`calibration_rows`).
        measure: runs each measurement, `measure(fn) -> fn()` (default: right here). Training passes one that
            measures on the main process only and sends the result to the others.
        kept_window: the layers `layers` leaves softmax are converted too, with this window (and the options'
            sinks) beside the target's state, so the model's memory is constant (`bounded_layers`).
        source, copy, **options: as for `convert` (the options also apply to the ranking's one-layer conversions).
    """
    ConvertSettings(target, layers=layers, rank_by=rank_by, rank_sweep=rank_sweep, init=init, calibration_rows=rows,
                    calibration_length=length, kept_window=kept_window)  # a ValueError names a bad one, first
    if init == "teacher" and not get_mixer(target).teacher_init:  # refused before anything is measured
        raise ValueError(teacher_init_refusal(target))
    measure = measure or (lambda fn: fn())
    converted = measure(lambda: resolve_layers(layers, model, tokenizer, target, data=data, rows=rows, length=length,
                                               out_dir=ranking_dir, rank_by=rank_by, rank_sweep=rank_sweep,
                                               **options))
    lookback = measure(lambda: teacher_lookback(model, tokenizer, data, rows, length)) if init == "teacher" else None
    converted, layer_options = bounded_layers(converted, model.config.num_hidden_layers, kept_window)
    return convert(model, target, layers=converted, source=source, lookback=lookback, copy=copy,
                   layer_options=layer_options, **options)


def bounded_layers(converted, num_layers: int, kept_window: int | None) -> tuple[object, dict | None]:
    """(layers, layer_options) for `convert`: `converted` unchanged without `kept_window`; with it, every layer,
    those `converted` leaves softmax given `{"window": kept_window}` of their own."""
    if kept_window is None:
        return converted, None
    kept = sorted(set(range(num_layers)) - set(parse_layers(converted, num_layers)))
    return None, {index: {"window": kept_window} for index in kept}
