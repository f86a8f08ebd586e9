"""`evaluate()`: a model against its baseline on every requested measurement, into one results dict.

Measurements (`EvalSettings.suites`): `ppl` (perplexity by position with window rows), `mqar` and
`passkey` (synthetic recall), any lm-eval suite or task (`t2r.eval.harness`), and `bench` (speed and memory).
Settings are checked before any model loads; lengths against the loaded models before any scoring.
"""

from __future__ import annotations

import platform
import sys
import time
from dataclasses import asdict, dataclass, field

import torch

from t2r.data import DataConfig

from . import bench, harness, perplexity, recall
from .contenders import Contender, memory_matched_window

BUILTIN_SUITES = ("ppl", "mqar", "passkey", "bench")
HELD_OUT = "held-out"
"""`data` value in a recipe's eval section: the recipe's own held-out documents (`data.held_out`)."""
DEFAULT_SUITES = ("ppl", "mqar", "passkey")


@dataclass
class EvalSettings:
    """What to measure and how much of it; every field has a default that runs on a laptop CPU."""

    baseline: str | None = None
    """Model to compare with (directory, hub id, file.gguf, smollm2); None: the source a converted model
    records; `none`: no baseline (e.g. when the source is evaluated once for several students)."""
    suites: list[str] = field(default_factory=lambda: list(DEFAULT_SUITES))
    """ppl, mqar, passkey, bench, and lm-eval suites (commonsense, knowledge, aggregate, recall, local)."""
    tasks: list[str] = field(default_factory=list)
    """lm-eval task names or local multiple-choice .jsonl files / directories."""
    limit: int | None = None
    """Cap on rows / prompts per cell / lm-eval documents per task (quick looks)."""
    data: str | None = None
    """Held-out text for perplexity (local file, directory or hub dataset id); None: generated long documents;
    in a recipe, `held-out`: the recipe's held-out documents."""
    data_documents: int = 256
    """How many held-out documents to read from `data`."""
    text_field: str = "text"
    ppl_length: int = 2048
    ppl_rows: int = 16
    pack: bool = False
    """Join documents end to end (EOS between) instead of using documents at least `ppl_length` long."""
    windows: list[int] = field(default_factory=lambda: [64, 256])
    sinks: int = 4
    mqar_pairs: list[int] = field(default_factory=lambda: [8, 32, 64])
    mqar_prompts: int = 8
    passkey_lengths: list[int] = field(default_factory=lambda: [512, 1024, 2048, 4096])
    passkey_depths: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    passkey_prompts: int = 2
    lm_eval_max_length: int = 2048
    bench_contexts: list[int] = field(default_factory=lambda: [512, 1024, 2048])
    bench_batch_sizes: list[int] = field(default_factory=lambda: [1])
    bench_decode_tokens: int = 16
    bench_repeats: int = 3
    """Timed repeats per bench cell (after one warm-up run)."""
    batch_size: int = 1
    seed: int = 0
    device: str | None = None
    dtype: str = "auto"

    def __post_init__(self):
        self.check()

    def harness_specs(self) -> list[harness.TaskSpec]:
        """The lm-eval tasks asked for, validated against lm-eval's index (no model needed)."""
        suites = [s for s in self.suites if s not in BUILTIN_SUITES]
        if not suites and not self.tasks:
            return []
        return harness.resolve_tasks(",".join(suites) or None, list(self.tasks))

    def check(self) -> None:
        """Raise ValueError naming the bad field, before anything loads."""
        for name in ("ppl_length", "ppl_rows", "data_documents", "mqar_prompts", "passkey_prompts", "batch_size",
                     "bench_decode_tokens", "bench_repeats", "lm_eval_max_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1, got {self.limit}")
        for name in ("windows", "mqar_pairs", "passkey_lengths", "bench_contexts", "bench_batch_sizes"):
            if any(v < 1 for v in getattr(self, name)):
                raise ValueError(f"{name} must hold positive integers, got {getattr(self, name)}")
        if any(not 0 <= d <= 1 for d in self.passkey_depths):
            raise ValueError(f"passkey_depths must lie in [0, 1], got {self.passkey_depths}")
        if self.data not in (None, HELD_OUT):
            from t2r.data.documents import is_local, local_files

            if is_local(self.data):
                local_files(self.data)  # raises naming the missing file or unsupported suffix

    def capped(self, count: int) -> int:
        return min(count, self.limit) if self.limit else count


def describe(spec: str, model) -> dict:
    from t2r.convert import count_parameters
    from t2r.models.generation_cache import generation_memory

    fixed, per_token = generation_memory(model.config, next(model.parameters()).element_size())
    return {"spec": spec, "model_type": model.config.model_type, "parameters": count_parameters(model),
            "mixers": getattr(model.config, "t2r_mixers", None), "state_bytes": fixed,
            "cache_bytes_per_token": per_token}


def check_tokenizers(tokenizer, other, model_spec: str, baseline_spec: str) -> None:
    if tokenizer.get_vocab() != other.get_vocab():
        raise ValueError(f"the baseline {baseline_spec!r} uses another tokenizer than {model_spec!r}: token "
                         "perplexity and recall are only comparable over one vocabulary; pass --baseline with the "
                         "model's source")


def label(model) -> str:
    """Short row name: the converted mixers (`gsa`, `gsa+gla`), or `source` for an unconverted model."""
    mixers = sorted(set(getattr(model.config, "t2r_mixers", None) or []) - {"softmax"})
    return "+".join(mixers) if mixers else "source"


def labels(model, baseline) -> tuple[str, str | None]:
    """Row names of a model and its baseline, told apart when they would read the same."""
    name, other = label(model), (label(baseline) if baseline is not None else None)
    return (f"{name} (model)", f"{other} (baseline)") if name == other else (name, other)


def contenders(model, model_name: str, baseline, baseline_name: str | None, settings: EvalSettings,
               length: int) -> list[Contender]:
    """The model, its baseline, and window baselines of the softmax model among them (fixed windows, and the
    window whose KV cache takes the model's state bytes)."""
    found = [Contender(model_name, model, role="model")]
    softmax = None
    if baseline is not None:
        found.append(Contender(baseline_name, baseline, role="baseline"))
        softmax = baseline if not getattr(baseline.config, "t2r_mixers", None) else None
    elif not getattr(model.config, "t2r_mixers", None):
        softmax = model
    if softmax is None:
        return found
    windows = [w for w in settings.windows if w + settings.sinks < length]
    if baseline is not None:
        matched = memory_matched_window(model.config, baseline.config, length, settings.sinks,
                                        next(baseline.parameters()).element_size())
        if matched is not None and matched + settings.sinks < length and matched not in windows:
            found.append(Contender(f"mem window {matched}+{settings.sinks}", softmax, matched, settings.sinks, "window"))
    found += [Contender(f"window {w}+{settings.sinks}", softmax, w, settings.sinks, "window") for w in windows]
    return found


def check_lengths(found: list[Contender], settings: EvalSettings) -> None:
    needed = {"ppl": settings.ppl_length, "passkey": max(settings.passkey_lengths)}
    for suite, length in needed.items():
        if suite not in settings.suites:
            continue
        for c in found:
            limit = c.max_length()
            if limit is not None and length > limit:
                raise ValueError(f"{suite} asks for {length} tokens but {c.name} supports {limit} "
                                 f"(max_position_embeddings); lower the length")


def long_text_data(settings: EvalSettings, out_dir) -> DataConfig:
    """The held-out text: `settings.data`, or generated long documents written to `out_dir`."""
    if settings.data is not None:
        return DataConfig(path=settings.data, text_field=settings.text_field, held_out=settings.data_documents)
    from t2r.data.synthetic import write_long_jsonl

    path = write_long_jsonl(f"{out_dir}/heldout-long.jsonl", count=settings.ppl_rows, seed=10_000 + settings.seed)
    return DataConfig(path=str(path), held_out=settings.ppl_rows)


def environment(device: str) -> dict:
    import transformers

    import t2r

    env = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "t2r": t2r.__version__, "device": device, "threads": torch.get_num_threads()}
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
             data_seed: int | None = None, command: str | None = None) -> dict:
    """Every measurement of `settings` for `model` (and `baseline`, scored on the same inputs). `data` overrides
    `settings.data` (shuffled with `data_seed`, default the settings' seed: a recipe's held-out split)."""
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
        "seconds": {},
    }
    found = contenders(model, model_name, baseline, baseline_name, settings, settings.ppl_length)
    check_lengths(found, settings)
    torch.manual_seed(settings.seed)

    if "ppl" in settings.suites:
        start = time.perf_counter()
        data = data or long_text_data(settings, out_dir)
        ids = perplexity.token_rows(data, tokenizer, settings.ppl_length, settings.capped(settings.ppl_rows),
                                    settings.seed if data_seed is None else data_seed, settings.pack)
        rows = perplexity.position_perplexity(found, ids, settings.batch_size)
        results["perplexity"] = {
            "data": data.path, "length": settings.ppl_length, "rows": len(ids), "pack": settings.pack,
            "results": [{**r.to_dict(), "role": c.role, "window": c.window, "sinks": c.sinks if c.window else None}
                        for r, c in zip(rows, found)]}
        results["seconds"]["ppl"] = time.perf_counter() - start
    scored = found
    if "mqar" in settings.suites:
        start = time.perf_counter()
        results["mqar"] = recall.mqar(scored, tokenizer, settings.mqar_pairs, settings.capped(settings.mqar_prompts),
                                      settings.seed, settings.batch_size)
        results["seconds"]["mqar"] = time.perf_counter() - start
    if "passkey" in settings.suites:
        start = time.perf_counter()
        results["passkey"] = recall.passkey(scored, tokenizer, settings.passkey_lengths, settings.passkey_depths,
                                            settings.capped(settings.passkey_prompts), settings.seed,
                                            settings.batch_size)
        results["seconds"]["passkey"] = time.perf_counter() - start
    if specs:
        start = time.perf_counter()
        results["tasks"] = {}
        for name, m, tok in ((model_name, model, tokenizer), (baseline_name, baseline, baseline_tokenizer or tokenizer)):
            if m is not None:
                out = harness.run_harness(m, tok, specs, limit=settings.limit, batch_size=settings.batch_size,
                                          max_length=settings.lm_eval_max_length, seed=settings.seed)
                results["tasks"][name] = out
                results["environment"]["lm_eval"] = out["lm_eval_version"]
        results["seconds"]["lm-eval"] = time.perf_counter() - start
    if "bench" in settings.suites:
        start = time.perf_counter()
        rows = []
        for name, m in ((model_name, model), (baseline_name, baseline)):
            if m is not None:
                rows += bench.bench_model(m, name, settings.bench_contexts, settings.bench_batch_sizes,
                                          settings.bench_decode_tokens, repeats=settings.bench_repeats,
                                          seed=settings.seed, allow_beyond=True)  # speed, not quality
        results["bench"] = [asdict(r) for r in rows]
        results["seconds"]["bench"] = time.perf_counter() - start
    return results
