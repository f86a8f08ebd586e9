"""The suites `evaluate()` runs, one `SUITES` entry each, in the order they run: the function that scores it, the
words of its progress note, and what it needs (held-out texts, a baseline, tokens per model).

A new suite is one entry here (and its name in `t2r.eval.settings.BUILTIN_SUITES`); a scorer reads what it
needs from the `Run` and writes its section of `run.results`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from t2r.data import DataConfig
from t2r.words import counted

from . import bench, divergence, harness, perplexity, recall
from .contenders import Contender
from .result_cache import ResultCache
from .settings import EvalSettings


@dataclass
class Run:
    """One evaluation under way: what its suites read (settings, models, contenders, cache, held-out texts) and the
    results they fill. `rows_of`: label -> the token rows of that text, shared by ppl and kl."""

    settings: EvalSettings
    model: Any
    tokenizer: Any
    baseline: Any
    baseline_tokenizer: Any
    found: list[Contender]
    cache: ResultCache
    fingerprint: str | None
    specs: list
    results: dict
    data_seed: int | None = None
    texts: list[tuple[str, DataConfig]] = field(default_factory=list)
    rows_of: dict = field(default_factory=dict)

    def pair(self) -> list[tuple[str, Any, Any, str | None]]:
        """(name, model, tokenizer, cache fingerprint) of the model and, when given, its baseline."""
        names = self.results["names"]
        found = [(names["model"], self.model, self.tokenizer, None)]
        if self.baseline is not None:
            found.append((names["baseline"], self.baseline, self.baseline_tokenizer or self.tokenizer,
                          self.fingerprint))
        return found

    def rows(self, label: str, config: DataConfig):
        if label not in self.rows_of:
            s = self.settings
            self.rows_of[label] = perplexity.token_rows(config, self.tokenizer, s.ppl_length, s.ppl_rows,
                                                        s.seed if self.data_seed is None else self.data_seed, s.pack)
        return self.rows_of[label]

    def with_roles(self, scored: list[dict]) -> list[dict]:
        """Each contender's scores with its role and window, as the report and the frontier read them."""
        return [{**r, "role": c.role, "window": c.window, "sinks": c.sinks if c.window else None}
                for r, c in zip(scored, self.found)]

    def text_section(self, index: int, label: str, config: DataConfig, key: str, section: dict) -> None:
        """The first text's sections at the top level (`results["perplexity"]`, `results["kl"]`), the others'
        in `results["texts"]`, one entry per text."""
        section = {"data": config.path, "label": label, "length": self.settings.ppl_length,
                   "rows": len(self.rows(label, config)), "pack": self.settings.pack, **section}
        if index == 0:
            self.results[key] = section
            return
        entry = next((t for t in self.results.setdefault("texts", []) if t["label"] == label), None)
        if entry is None:
            entry = {"label": label, "data": config.path}
            self.results["texts"].append(entry)
        entry[key] = section


@dataclass(frozen=True)
class Suite:
    """One measurement: `score(run)` fills its results, `what(run)` words its progress note. `pair`: it scores
    the model and its baseline only (not the students and windows); `texts`: it reads the held-out texts;
    `baseline`: why it needs a baseline (a ValueError without one); `length`: the tokens each model must support;
    `asked`: whether the settings (and lm-eval specs) ask for it, by default its name among the suites."""

    name: str
    score: Callable[[Run], None]
    what: Callable[[Run], str]
    pair: bool = False
    texts: bool = False
    baseline: str | None = None
    length: Callable[[EvalSettings], int] | None = None
    asked: Callable[[EvalSettings, list], bool] | None = None

    def wanted(self, settings: EvalSettings, specs: list) -> bool:
        return self.asked(settings, specs) if self.asked else self.name in settings.suites


def score_ppl(run: Run) -> None:
    for index, (label, config) in enumerate(run.texts):
        scored = perplexity.position_perplexity(run.found, run.rows(label, config), run.settings.batch_size,
                                                cache=run.cache)
        run.text_section(index, label, config, "perplexity", {"results": run.with_roles([r.to_dict() for r in scored])})


def score_kl(run: Run) -> None:
    reference = next((c for c in run.found if c.role == "baseline"), None)
    for index, (label, config) in enumerate(run.texts):
        scored = divergence.position_kl(run.found, reference, run.rows(label, config), run.settings.batch_size,
                                        cache=run.cache)
        run.text_section(index, label, config, "kl", {"reference": reference.name, "results": run.with_roles(scored)})


def score_mqar(run: Run) -> None:
    s = run.settings
    run.results["mqar"] = recall.mqar(run.found, run.tokenizer, s.mqar_pairs, s.mqar_prompts, s.seed, s.batch_size,
                                      cache=run.cache)


def score_passkey(run: Run) -> None:
    s = run.settings
    run.results["passkey"] = recall.passkey(run.found, run.tokenizer, s.passkey_lengths, s.passkey_depths,
                                            s.passkey_prompts, s.seed, s.batch_size, cache=run.cache)


def score_lm_eval(run: Run) -> None:
    run.results["tasks"] = {}
    for name, m, tok, fp in run.pair():
        out = lm_eval_scores(m, tok, run.specs, run.settings, run.cache, fp)
        run.results["tasks"][name] = out
        run.results["environment"]["lm_eval"] = out["lm_eval_version"]


def score_bench(run: Run) -> None:
    s, rows = run.settings, []
    for name, m, _, _ in run.pair():  # timed afresh for both: speed is only comparable within one run
        rows += bench.bench_model(m, name, s.bench_contexts, s.bench_batch_sizes, s.bench_decode_tokens,
                                  repeats=s.bench_repeats, seed=s.seed, allow_beyond=True,  # speed, not quality
                                  decode=s.bench_decode)
    run.results["bench"] = [asdict(r) for r in rows]


def _lm_eval_what(run: Run) -> str:
    limit = run.settings.lm_eval_limit
    return f"{counted(len(run.specs), 'task')}, {f'{limit} documents each' if limit else 'every document'}"


SUITES = (
    Suite("ppl", score_ppl, lambda run: f"{counted(run.settings.ppl_rows, 'row')} of {run.settings.ppl_length} "
          "tokens" + (f" of each of {len(run.texts)} texts" if len(run.texts) > 1 else ""),
          texts=True, length=lambda s: s.ppl_length),
    Suite("kl", score_kl, lambda run: f"KL to {run.results['names']['baseline']} by position, on the perplexity rows",
          texts=True, baseline="scores KL to the baseline"),
    Suite("mqar", score_mqar, lambda run: f"{counted(run.settings.mqar_prompts, 'prompt')} of "
          f"{','.join(map(str, run.settings.mqar_pairs))} pairs"),
    Suite("passkey", score_passkey, lambda run: f"{counted(run.settings.passkey_prompts, 'prompt')} at lengths "
          f"{','.join(map(str, run.settings.passkey_lengths))} x depths "
          f"{','.join(f'{d:g}' for d in run.settings.passkey_depths)}", length=lambda s: max(s.passkey_lengths)),
    Suite("lm-eval", score_lm_eval, _lm_eval_what, pair=True, asked=lambda settings, specs: bool(specs)),
    Suite("bench", score_bench, lambda run: f"contexts {','.join(map(str, run.settings.bench_contexts))}", pair=True),
)
"""Every suite, in the order `evaluate()` runs them: perplexity and recall first, lm-eval and the bench after."""


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
