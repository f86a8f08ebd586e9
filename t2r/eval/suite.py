"""`evaluate()`: a model against its baseline on every requested measurement, into one results dict.

Measurements (`EvalSettings.suites`): `ppl` (perplexity by position with window rows), `kl`, `mqar` and
`passkey` (synthetic recall), any lm-eval suite or task (`t2r.eval.harness`), and `bench` (speed and memory); each
is one entry of `t2r.eval.scorers.SUITES`, naming its scorer and what it needs.
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

from . import frontier, quick, report, result_cache
from .contenders import Contender, memory_matched_window
from .progress import note
from .result_cache import NO_CACHE, ResultCache
from .scorers import SUITES, Run, lm_eval_scores  # noqa: F401 (lm_eval_scores: its old home)
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
    for suite in SUITES:
        if suite.length is None or suite.name not in settings.suites:
            continue
        length = suite.length(settings)
        for name, limit in limits.items():
            if limit is not None and length > limit:
                raise ValueError(f"{suite.name} asks for {length} tokens but {name} supports {limit} "
                                 f"(max_position_embeddings); lower the length")


def check_ppl_rows(settings: EvalSettings, tokenizer, data: DataConfig | None = None,
                   data_seed: int | None = None) -> dict:
    """{label: rows} of each held-out text perplexity and KL score (`Run.rows`), or a ValueError in one line when
    one gives fewer rows than `settings.ppl_rows` (after the quick look's cut), before anything is scored: a text
    has at most its documents (`data.held_out` of a recipe, `data_documents` of `--data`; generated ones: as many
    as rows asked, up to `data_documents`, written and read when scored)."""
    from t2r.data.rows import token_rows

    settings, _ = quick.shrink(settings)
    if not any(suite.texts and suite.name in settings.suites for suite in SUITES):
        return {}
    asked = f"eval.ppl_rows: {settings.ppl_rows:,} rows of {settings.ppl_length:,} tokens asked"
    if data is None and settings.data is None:
        if settings.ppl_rows > settings.data_documents:
            raise ValueError(f"{asked}, but the generated held-out text is at most data_documents="
                             f"{settings.data_documents} documents (one row each); lower ppl_rows or raise "
                             "data_documents")
        return {}
    more = "data.held_out" if data is not None else "eval.data_documents"
    rows = {}
    for label, config in held_out_texts(settings, None, data):
        rows[label] = token_rows(config, tokenizer, settings.ppl_length, settings.ppl_rows,
                                 settings.seed if data_seed is None else data_seed, settings.pack)
        if (found := len(rows[label])) < settings.ppl_rows:
            each = "joined end to end" if settings.pack else f"of at least {settings.ppl_length:,} tokens each"
            raise ValueError(f"{asked}, but {label} gives {found} ({config.held_out} documents read, {each}); lower "
                             f"ppl_rows or ppl_length, or read more documents ({more})"
                             f"{'' if settings.pack else ' or join them (pack)'}")
    return rows


def check_recall_words(settings: EvalSettings, tokenizer) -> None:
    """A ValueError in one line, before anything is scored, when MQAR is asked and the tokenizer lacks the
    single-token words its largest prompt draws its keys and values from (`t2r.data.recall_prompts`)."""
    if "mqar" not in settings.suites or not settings.mqar_pairs or tokenizer is None:
        return
    from t2r.data.recall_prompts import word_tokens

    pairs = max(settings.mqar_pairs)
    try:
        word_tokens(tokenizer, max(4 * pairs, 64), settings.seed)
    except ValueError as err:
        raise ValueError(f"eval.mqar_pairs: {pairs} pairs asked, but {err}; lower mqar_pairs (a quarter of the "
                         "words, at most) or leave mqar out of the suites") from None


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

    The suites run in the order of `scorers.SUITES` (perplexity and recall first, lm-eval tasks and the bench after);
    report.md and results.json are rewritten in `out_dir` after each, so a run cut short keeps what it measured.
    With `settings.cache`, the baseline's scores (and its windows') are read from / stored in `cache_root` (default
    `$T2R_CACHE/eval`). With `settings.limit`, every suite is shrunk first (`t2r.eval.quick`); `results["quick"]`
    lists the cuts."""
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
    rows = check_ppl_rows(settings, tokenizer, data, data_seed)
    check_recall_words(settings, tokenizer)
    results["contenders"] = [contender_info(c, found) for c in found]
    asked = [s for s in SUITES if s.wanted(settings, specs)]
    for suite in asked:
        if suite.baseline and baseline is None:
            raise ValueError(f"the {suite.name} suite {suite.baseline}: give a baseline (--baseline, or leave the "
                             f"default: the source the model records), or leave {suite.name} out of the suites")
    torch.manual_seed(settings.seed)
    pending = [s.name for s in asked]
    if cuts:
        note(f"quick look (limit {settings.limit}): " + "; ".join(cuts))
    run = Run(settings, model, tokenizer, baseline, baseline_tokenizer, found, cache, fingerprint, specs, results,
              data_seed, rows_of=rows)
    if any(s.texts for s in asked):  # generated documents are written only when a suite reads them
        run.texts = held_out_texts(settings, out_dir, data)
    for suite in asked:
        names = [name for name, *_ in run.pair()] if suite.pair else [c.name for c in found]
        note(f"{suite.name}: {suite.what(run)}; {counted(len(names), 'model')} ({', '.join(names)})")
        start = time.perf_counter()
        suite.score(run)
        results["seconds"][suite.name] = time.perf_counter() - start
        note(f"{suite.name}: done in {results['seconds'][suite.name]:.0f} s")
        pending.remove(suite.name)
        measured(results, pending, cache, out_dir)
    results.pop("unfinished", None)
    return results


def measured(results: dict, pending: list[str], cache: ResultCache, out_dir) -> None:
    """After each suite: the suites still to run, the cache's counts and the frontier into `results`, and the
    report rewritten (without plots) while any suite is left."""
    results["unfinished"] = list(pending)
    if cache.enabled:
        results["cache"] = {"dir": str(cache.root), "read": cache.hits, "scored": cache.misses}
    results["frontier"] = frontier.frontiers(results)
    if pending:
        report.write(results, out_dir, with_plots=False)
