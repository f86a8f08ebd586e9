"""`t2r run` as a library call: finetune a recipe (`t2r.train.finetune`), then evaluate its final model against
the source with the recipe's `eval:` section (`t2r.eval.evaluate`), report and model card included."""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable

from t2r.eval.settings import HELD_OUT, EvalSettings


@dataclass
class RunResult:
    """What `finetune_and_evaluate` leaves: the finetuning's final metrics, the model directory (final/), and the
    evaluation's report.md and results (None on the processes other than the main one, which only train)."""

    metrics: dict
    model_dir: Path
    report: Path | None = None
    results: dict | None = None


def run_eval_settings(recipe) -> EvalSettings:
    """What `t2r run` evaluates: the recipe's `eval:` section, or perplexity by position alone."""
    return recipe.eval or EvalSettings(suites=["ppl"])


def finetune_and_evaluate(recipe, *, resume: bool = False, overwrite: bool = False,
                          callbacks: Iterable[Callable[[dict], None]] = (), command: str | None = None,
                          clock=None) -> RunResult:
    """`finetune(recipe, resume, callbacks, overwrite)`, then `recipe.checkpoint.dir`/final evaluated against
    `eval.baseline` (default: the recipe's source) into `checkpoint.dir`/eval (report.md, results.json, plots),
    and the evaluation put on final/'s model card. The evaluation's lengths are checked against both models'
    configs before anything trains (`check_eval_lengths`). `command` is recorded in results.json (default: this
    process's command line); `clock` times the start-up, as in `finetune`."""
    import torch
    from accelerate import PartialState

    from t2r.eval import evaluate, load_pair, write_report
    from t2r.eval.models import eval_dtype
    from t2r.eval.report import add_card_evaluation

    from .finetuning import finetune

    settings = run_eval_settings(recipe)
    check_eval_lengths(recipe, settings)  # before training: the eval must fit the model it will load
    check_eval_rows(recipe, settings, fetch=True)  # and its held-out text hold the rows it asks for
    metrics = finetune(recipe, resume=resume, overwrite=overwrite, callbacks=callbacks, clock=clock)
    root = Path(recipe.checkpoint.dir)
    final, out = root / "final", root / "eval"
    if not PartialState().is_main_process:
        return RunResult(metrics, final)
    release_host_memory()  # the evaluation must not stack on the training's freed memory (4.4 -> 4.0 GB on CPU)
    device = settings.device or ("cuda" if torch.cuda.is_available() else "cpu")
    settings = replace(settings, dtype=eval_dtype(settings.dtype, device))
    model, tokenizer, baseline, baseline_tokenizer, baseline_spec = load_pair(
        str(final), settings.baseline or recipe.model.source, settings.dtype, device)
    data = recipe.data.data_config() if settings.data == HELD_OUT else None
    print(f"finetuned {metrics['step']} steps; evaluating {final} against {baseline_spec} into {out}")
    results = evaluate(model, tokenizer, settings, out, baseline=baseline, baseline_tokenizer=baseline_tokenizer,
                       model_spec=str(final), baseline_spec=baseline_spec, data=data, data_seed=recipe.train.seed,
                       command=command or " ".join(["t2r", *sys.argv[1:]]))
    report = write_report(results, out)
    add_card_evaluation(final, report.parent / "results.json")  # the card's evaluation, read from results.json
    return RunResult(metrics, final, report, results)


def check_eval_lengths(recipe, settings: EvalSettings) -> None:
    """The `eval:` section's lengths against the trained model and the baseline, from their configs alone (a config
    that cannot be read, an offline hub id, is left to the evaluation itself). A config t2r has built in
    (`known_config`: the 7B recipes' sources) is read without the hub, as the plan does; another hub id is
    looked up after `offline_if_unreachable` (an offline machine retried the hub for 24 s here)."""
    from t2r.eval.contenders import length_limit
    from t2r.eval.suite import check_length_limits
    from t2r.models.known_configs import known_config
    from t2r.paths import offline_if_unreachable
    from t2r.sources import shape_config

    def config(spec):
        if known_config(spec) is None:
            offline_if_unreachable(spec)
        return shape_config(spec)

    try:
        source = config(recipe.model.source)
        baseline_spec = settings.baseline or recipe.model.source
        baseline = None if baseline_spec == "none" else source if baseline_spec == recipe.model.source else (
            config(baseline_spec))
    except OSError:
        return
    target, layers = recipe.convert.target, recipe.convert.layers
    mixers = [target] if target != "none" and layers is None else None  # some layers kept as softmax: the limit
    limits = {f"{recipe.checkpoint.dir}/final": length_limit(source, mixers)}
    if baseline is not None:
        limits[baseline_spec] = length_limit(baseline)
    try:
        check_length_limits(limits, settings)
    except ValueError as err:
        raise ValueError(f"eval: {err} (checked before training; the recipe's eval section sets it)") from None


def check_eval_rows(recipe, settings, fetch: bool) -> None:
    """The `eval:` section's perplexity rows against its held-out text, and its MQAR prompts against the words of
    the vocabulary, with the source's tokenizer (the trained model's). Without `fetch` (`--dry-run`), only a
    tokenizer in a local directory is read; one that cannot be read (an offline hub id) is left to the evaluation
    itself."""
    from t2r.eval.suite import check_ppl_rows, check_recall_words
    from t2r.sources import load_tokenizer

    data = recipe.data.data_config() if settings.data == HELD_OUT else None
    tokenizer = None
    if data is not None or settings.data or "mqar" in settings.suites:
        if not fetch and not (Path(recipe.model.source).expanduser() / "tokenizer_config.json").is_file():
            return
        try:
            tokenizer = load_tokenizer(recipe.model.source)
        except OSError:
            return
    try:
        check_ppl_rows(settings, tokenizer, data, recipe.train.seed)
        check_recall_words(settings, tokenizer)
    except ValueError as err:
        raise ValueError(f"{err} (checked before training; the recipe's eval section sets it)") from None


def release_host_memory() -> None:
    """Hand memory freed by a finished phase back to the system: collect reference cycles (accelerate's
    objects hold the model and optimizer in some), then glibc's `malloc_trim`, without which the heap
    keeps the freed pages and the next phase's allocations add to them."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS, Windows, musl): its allocator decides
        pass
