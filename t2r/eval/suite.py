"""`evaluate()`: a model against its baseline on every requested measurement, into one results dict.

Measurements (`EvalSettings.suites`): `ppl` (perplexity by position with window rows), `mqar` and
`passkey` (synthetic recall), any lm-eval suite or task (`t2r.eval.harness`), and `bench` (speed and memory).
Settings are checked before any model loads; lengths against the loaded models before any scoring.
"""

from __future__ import annotations

import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from t2r.data import DataConfig
from t2r.version import version
from t2r.words import counted

from . import bench, divergence, frontier, harness, perplexity, quick, recall, report, result_cache
from .contenders import Contender, memory_matched_window
from .progress import note
from .result_cache import NO_CACHE, ResultCache
from .settings import BUILTIN_SUITES, DEFAULT_SUITES, HELD_OUT, EvalSettings  # noqa: F401 (their old home)


def describe(spec: str, model) -> dict:
    from t2r.convert import count_parameters
    from t2r.models.generation_cache import generation_memory

    fixed, per_token = generation_memory(model.config, next(model.parameters()).element_size())
    return {"spec": spec, "model_type": model.config.model_type, "parameters": count_parameters(model),
            "mixers": getattr(model.config, "t2r_mixers", None), "state_bytes": fixed,
            "cache_bytes_per_token": per_token}


def check_tokenizers(tokenizer, other, model_spec: str, other_spec: str, role: str = "baseline") -> None:
    if tokenizer.get_vocab() != other.get_vocab():
        raise ValueError(f"the {role} {other_spec!r} uses another tokenizer than {model_spec!r}: token "
                         "perplexity and recall are only comparable over one vocabulary; "
                         + ("pass --baseline with the model's source" if role == "baseline" else
                            "give students converted from the model's source"))


def label(model) -> str:
    """Short row name: the converted mixers (`gsa`, `gsa+gla`), or `source` for an unconverted model."""
    mixers = sorted(set(getattr(model.config, "t2r_mixers", None) or []) - {"softmax"})
    return "+".join(mixers) if mixers else "source"


def labels(model, baseline) -> tuple[str, str | None]:
    """Row names of a model and its baseline, told apart when they would read the same."""
    name, other = label(model), (label(baseline) if baseline is not None else None)
    return (f"{name} (model)", f"{other} (baseline)") if name == other else (name, other)


def contenders(model, model_name: str, baseline, baseline_name: str | None, settings: EvalSettings,
               length: int, baseline_fingerprint: str | None = None, students: list[Contender] = ()) -> list[Contender]:
    """The model, its baseline, other `students`, and window baselines of the softmax model among them (the
    windows of `settings`, and the window whose KV cache takes the model's state bytes). The baseline and windows
    of it carry `baseline_fingerprint` (their scores may be reused)."""
    found = [Contender(model_name, model, role="model")]
    softmax = fingerprint = None
    if baseline is not None:
        found.append(Contender(baseline_name, baseline, role="baseline", fingerprint=baseline_fingerprint))
    found += students
    if baseline is not None:
        if not getattr(baseline.config, "t2r_mixers", None):
            softmax, fingerprint = baseline, baseline_fingerprint
    elif not getattr(model.config, "t2r_mixers", None):
        softmax = model
    if softmax is None:
        return found
    sinks = settings.sinks
    windows = [w for w in settings.windows if w + sinks < length]
    if baseline is not None:
        matched = memory_matched_window(model.config, baseline.config, length, sinks,
                                        next(baseline.parameters()).element_size())
        if matched is not None and matched + sinks < length and matched not in windows:
            found.append(Contender(f"mem window {matched}+{sinks}", softmax, matched, sinks, "window", fingerprint))
    found += [Contender(f"window {w}+{sinks}", softmax, w, sinks, "window", fingerprint) for w in windows]
    return found


def contender_info(c: Contender, found: list[Contender]) -> dict:
    """What the frontier needs of a contender: its role, window, and generation memory (fixed state and bytes
    per token; `windowed`: the softmax model the windows cut)."""
    from t2r.models.generation_cache import generation_memory

    fixed, per_token = generation_memory(c.model.config, next(c.model.parameters()).element_size())
    return {"name": c.name, "role": c.role, "window": c.window, "sinks": c.sinks if c.window else 0,
            "state_bytes": fixed, "bytes_per_token": per_token,
            "windowed": c.window is None and any(w.window and w.model is c.model for w in found)}


def load_students(settings: EvalSettings, tokenizer, model, taken: set[str], cache: ResultCache,
                  results: dict) -> list[Contender]:
    """`settings.students` loaded like the model (dtype, device), named `<mixers> (<directory>)`, described in
    `results["models"]`; their tokenizer must be the model's."""
    from t2r.sources import load_source

    parameter = next(model.parameters())
    found = []
    for i, spec in enumerate(settings.students, 1):
        student, student_tokenizer = load_source(spec, dtype=str(parameter.dtype).removeprefix("torch."),
                                                 device=str(parameter.device))
        check_tokenizers(tokenizer, student_tokenizer, "the model", spec, role="student")
        path = Path(spec)
        name = f"{label(student)} ({path.parent.name if path.name == 'final' else path.name})"
        name = name if name not in taken else f"{name} #{i}"
        taken.add(name)
        found.append(Contender(name, student, role="student", fingerprint=cache.fingerprint(spec, student,
                                                                                           student_tokenizer)
                               if cache.enabled else None))
        results["models"][f"student {i}"] = describe(spec, student)
    return found


def check_lengths(found: list[Contender], settings: EvalSettings) -> None:
    check_length_limits({c.name: c.max_length() for c in found}, settings)


def check_length_limits(limits: dict[str, int | None], settings: EvalSettings) -> None:
    """ValueError when a suite asks for more tokens than a model (name -> `length_limit`) supports."""
    needed = {"ppl": settings.ppl_length, "passkey": max(settings.passkey_lengths)}
    for suite, length in needed.items():
        if suite not in settings.suites:
            continue
        for name, limit in limits.items():
            if limit is not None and length > limit:
                raise ValueError(f"{suite} asks for {length} tokens but {name} supports {limit} "
                                 f"(max_position_embeddings); lower the length")


def held_out_texts(settings: EvalSettings, out_dir, data: DataConfig | None = None) -> list[tuple[str, DataConfig]]:
    """(label, data) of every held-out text perplexity and KL are scored on: `data` when given (a recipe's own
    held-out documents), else each of `settings.data`'s texts, else generated long documents written to
    `out_dir`. The label is the file's or dataset's name (`validation-00`), told apart when two would match."""
    if data is not None:
        return [(text_label(data.path), data)]
    if settings.data is None:
        from t2r.data.synthetic import write_long_jsonl

        path = write_long_jsonl(f"{out_dir}/heldout-long.jsonl", count=settings.ppl_rows, seed=10_000 + settings.seed)
        return [("generated", DataConfig(path=str(path), held_out=settings.ppl_rows))]
    found = []
    for i, text in enumerate(settings.texts(), 1):
        label = text_label(text)
        label = label if label not in {lab for lab, _ in found} else f"{label} #{i}"
        found.append((label, DataConfig(path=text, text_field=settings.text_field, held_out=settings.data_documents)))
    return found


def text_label(path: str) -> str:
    """`../corpus/validation-00.jsonl.gz` -> `validation-00`; `org/dataset` -> `dataset`."""
    name = Path(str(path).rstrip("/")).name or str(path)
    for suffix in (".gz", ".bz2", ".xz", ".zst", ".jsonl", ".json", ".txt", ".parquet"):
        name = name.removesuffix(suffix)
    return name or str(path)


def environment(device: str) -> dict:
    import transformers

    env = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "t2r": version(), "device": device, "threads": torch.get_num_threads()}
    if device.startswith("cuda"):
        env["device"] = f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    try:
        import lm_eval

        env["lm_eval"] = lm_eval.__version__
    except ImportError:
        env["lm_eval"] = None
    return env


def evaluate(model, tokenizer, settings: EvalSettings, out_dir, *, baseline=None, baseline_tokenizer=None,
             model_spec: str = "model", baseline_spec: str | None = None, data: DataConfig | None = None,
             data_seed: int | None = None, command: str | None = None, cache_root=None) -> dict:
    """Every measurement of `settings` for `model` (and `baseline`, scored on the same inputs). `data` overrides
    `settings.data` (shuffled with `data_seed`, default the settings' seed: a recipe's held-out split).

    Perplexity and recall come first, lm-eval tasks and the bench after; report.md and results.json are
    rewritten in `out_dir` after each, so a run cut short keeps what it measured. With `settings.cache`, the
    baseline's scores (and its windows') are read from / stored in `cache_root` (default `$T2R_CACHE/eval`).
    With `settings.limit`, every suite is shrunk first (`t2r.eval.quick`); `results["quick"]` lists the cuts."""
    settings, cuts = quick.shrink(settings)
    specs = settings.harness_specs()
    if baseline is not None and baseline_tokenizer is not None:
        check_tokenizers(tokenizer, baseline_tokenizer, model_spec, baseline_spec)
    model_name, baseline_name = labels(model, baseline)
    device = str(next(model.parameters()).device)
    results = {
        "command": command or " ".join(sys.argv), "settings": asdict(settings), "environment": environment(device),
        "names": {"model": model_name, "baseline": baseline_name},
        "models": {"model": describe(model_spec, model),
                   **({"baseline": describe(baseline_spec, baseline)} if baseline is not None else {})},
        "seconds": {}, **({"quick": cuts} if cuts else {}),
    }
    cache = ResultCache(cache_root or result_cache.default_root()) if settings.cache else NO_CACHE
    fingerprint = None
    if cache.enabled and baseline is not None:
        fingerprint = cache.fingerprint(baseline_spec, baseline, baseline_tokenizer or tokenizer)
    students = load_students(settings, tokenizer, model, {model_name, baseline_name}, cache, results)
    found = contenders(model, model_name, baseline, baseline_name, settings, settings.ppl_length, fingerprint,
                       students)
    check_lengths(found, settings)
    results["contenders"] = [contender_info(c, found) for c in found]
    if "kl" in settings.suites and baseline is None:
        raise ValueError("the kl suite scores KL to the baseline: give a baseline (--baseline, or leave the default: "
                         "the source the model records), or leave kl out of the suites")
    torch.manual_seed(settings.seed)
    pending = [s for s in ("ppl", "kl", "mqar", "passkey") if s in settings.suites] + ["lm-eval"] * bool(specs) + (
        ["bench"] if "bench" in settings.suites else [])

    if cuts:
        note(f"quick look (limit {settings.limit}): " + "; ".join(cuts))
    pair = [n for n in (model_name, baseline_name) if n is not None]

    def starting(name: str, what: str, names: list[str]) -> float:
        note(f"{name}: {what}; {counted(len(names), 'model')} ({', '.join(names)})")
        return time.perf_counter()

    def measured(name: str, start: float) -> None:
        results["seconds"][name] = time.perf_counter() - start
        note(f"{name}: done in {results['seconds'][name]:.0f} s")
        pending.remove(name)
        results["unfinished"] = list(pending)
        if cache.enabled:
            results["cache"] = {"dir": str(cache.root), "read": cache.hits, "scored": cache.misses}
        results["frontier"] = frontier.frontiers(results)
        if pending:
            report.write(results, out_dir, with_plots=False)

    # generated documents are written only when perplexity or KL reads them
    texts = held_out_texts(settings, out_dir, data) if {"ppl", "kl"} & set(settings.suites) else []
    rows_of = {}  # label -> the token rows of that text, shared by ppl and kl

    def rows(label: str, config: DataConfig) -> torch.Tensor:
        if label not in rows_of:
            rows_of[label] = perplexity.token_rows(config, tokenizer, settings.ppl_length, settings.ppl_rows,
                                                   settings.seed if data_seed is None else data_seed, settings.pack)
        return rows_of[label]

    def with_roles(scored: list[dict]) -> list[dict]:
        """Each contender's scores with its role and window, as the report and the frontier read them."""
        return [{**r, "role": c.role, "window": c.window, "sinks": c.sinks if c.window else None}
                for r, c in zip(scored, found)]

    def text_section(index: int, label: str, config: DataConfig, key: str, section: dict) -> None:
        """The first text's sections at the top level (`results["perplexity"]`, `results["kl"]`), the others'
        in `results["texts"]`, one entry per text."""
        section = {"data": config.path, "label": label, "length": settings.ppl_length,
                   "rows": len(rows(label, config)), "pack": settings.pack, **section}
        if index == 0:
            results[key] = section
        else:
            entry = next((t for t in results.setdefault("texts", []) if t["label"] == label), None)
            if entry is None:
                entry = {"label": label, "data": config.path}
                results["texts"].append(entry)
            entry[key] = section

    if "ppl" in settings.suites:
        start = starting("ppl", f"{counted(settings.ppl_rows, 'row')} of {settings.ppl_length} tokens"
                         + (f" of each of {len(texts)} texts" if len(texts) > 1 else ""), [c.name for c in found])
        for index, (label, config) in enumerate(texts):
            scored = perplexity.position_perplexity(found, rows(label, config), settings.batch_size, cache=cache)
            text_section(index, label, config, "perplexity", {"results": with_roles([r.to_dict() for r in scored])})
        measured("ppl", start)
    if "kl" in settings.suites:
        reference = next((c for c in found if c.role == "baseline"), None)
        start = starting("kl", f"KL to {baseline_name} by position, on the perplexity rows", [c.name for c in found])
        for index, (label, config) in enumerate(texts):
            scored = divergence.position_kl(found, reference, rows(label, config), settings.batch_size, cache=cache)
            text_section(index, label, config, "kl", {"reference": reference.name, "results": with_roles(scored)})
        measured("kl", start)
    if "mqar" in settings.suites:
        pairs = ",".join(map(str, settings.mqar_pairs))
        start = starting("mqar", f"{counted(settings.mqar_prompts, 'prompt')} of {pairs} pairs",
                         [c.name for c in found])
        results["mqar"] = recall.mqar(found, tokenizer, settings.mqar_pairs, settings.mqar_prompts,
                                      settings.seed, settings.batch_size, cache=cache)
        measured("mqar", start)
    if "passkey" in settings.suites:
        start = starting("passkey", f"{counted(settings.passkey_prompts, 'prompt')} at lengths "
                         f"{','.join(map(str, settings.passkey_lengths))} x depths "
                         f"{','.join(f'{d:g}' for d in settings.passkey_depths)}", [c.name for c in found])
        results["passkey"] = recall.passkey(found, tokenizer, settings.passkey_lengths, settings.passkey_depths,
                                            settings.passkey_prompts, settings.seed,
                                            settings.batch_size, cache=cache)
        measured("passkey", start)
    if specs:
        documents = f"{settings.lm_eval_limit} documents each" if settings.lm_eval_limit else "every document"
        start = starting("lm-eval", f"{counted(len(specs), 'task')}, {documents}", pair)
        results["tasks"] = {}
        for name, m, tok, fp in ((model_name, model, tokenizer, None),
                                 (baseline_name, baseline, baseline_tokenizer or tokenizer, fingerprint)):
            if m is not None:
                out = lm_eval_scores(m, tok, specs, settings, cache, fp)
                results["tasks"][name] = out
                results["environment"]["lm_eval"] = out["lm_eval_version"]
        measured("lm-eval", start)
    if "bench" in settings.suites:
        start = starting("bench", f"contexts {','.join(map(str, settings.bench_contexts))}", pair)
        rows = []
        for name, m in ((model_name, model), (baseline_name, baseline)):
            if m is not None:  # timed afresh for both: speed is only comparable within one run
                rows += bench.bench_model(m, name, settings.bench_contexts, settings.bench_batch_sizes,
                                          settings.bench_decode_tokens, repeats=settings.bench_repeats,
                                          seed=settings.seed, allow_beyond=True,  # speed, not quality
                                          decode=settings.bench_decode)
        results["bench"] = [asdict(r) for r in rows]
        measured("bench", start)
    results.pop("unfinished", None)
    return results


def lm_eval_scores(model, tokenizer, specs, settings: EvalSettings, cache: ResultCache, fingerprint: str | None):
    """`harness.run_harness` for one model; read from `cache` when `fingerprint` is given and the tasks (local
    files by content), limit, batch size, max length, seed and lm-eval version are those stored."""
    def run():
        return harness.run_harness(model, tokenizer, specs, limit=settings.lm_eval_limit,
                                   batch_size=settings.batch_size, max_length=settings.lm_eval_max_length,
                                   seed=settings.seed)

    if not cache.enabled or fingerprint is None:
        return run()
    from importlib.metadata import version as installed

    inputs = {"tasks": cache.with_file_digests([asdict(s) for s in specs]), "limit": settings.lm_eval_limit,
              "batch_size": settings.batch_size, "max_length": settings.lm_eval_max_length, "seed": settings.seed,
              "lm_eval": installed("lm_eval")}
    parameter = next(model.parameters())
    return cache.cached(cache.key_parts(fingerprint, "lm-eval", inputs, dtype=parameter.dtype,
                                        device=parameter.device), run)
