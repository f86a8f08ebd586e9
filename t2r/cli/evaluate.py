"""`t2r eval` and `t2r bench` (inference and, with --train, training)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from t2r.cli import threads
from t2r.cli.common import default_device
from t2r.cli.eval_flags import INFERENCE_ONLY, TRAIN_DEFAULTS, TRAIN_ONLY, flag, given_settings
from t2r.paths import check_model_spec, offline_if_unreachable
from t2r.sources import verify_ahead


def eval_settings(args):
    """`EvalSettings` of the flags given (the others keep the dataclass's defaults): with --tasks alone, no
    built-in suite."""
    from t2r.eval.settings import EvalSettings

    given = given_settings(args, "eval")
    if "suites" not in given and "tasks" in given:
        given["suites"] = []
    return EvalSettings(**given)


def run_eval(args) -> int:
    settings = eval_settings(args)
    for spec in (args.model, settings.baseline, *settings.students):
        check_model_spec(spec)
    offline_if_unreachable(args.model, settings.baseline, *settings.students)
    threads.note()
    for spec in (args.model, settings.baseline):  # their checksums hashed beside the imports below
        if spec:
            verify_ahead(spec)
    from t2r.eval import evaluate, load_pair, write_report
    from t2r.eval.models import eval_dtype
    from t2r.eval.report import add_card_evaluation

    settings.harness_specs()  # unknown task or suite: fail before loading anything
    device = default_device(settings.device)
    settings.dtype = eval_dtype(settings.dtype, device)
    model, tokenizer, baseline, baseline_tokenizer, baseline_spec = load_pair(args.model, settings.baseline,
                                                                              settings.dtype, device)
    results = evaluate(model, tokenizer, settings, args.out, baseline=baseline, baseline_tokenizer=baseline_tokenizer,
                       model_spec=args.model, baseline_spec=baseline_spec, command=" ".join(["t2r", *sys.argv[1:]]))
    report = write_report(results, args.out)
    print(report.read_text(), end="")
    print(f"report written to {report} (every number in {report.parent / 'results.json'})")
    card = add_card_evaluation(args.model, report.parent / "results.json")
    if card:
        print(f"model card {card} now shows this evaluation")
    return 0


def bench_settings(args):
    """`EvalSettings` of `t2r bench`'s flags, refusing a flag of the other mode (`--decode` with `--train`,
    `--steps` without it: it would be ignored); `--steps` takes its default."""
    from t2r.eval.settings import EvalSettings

    given = given_settings(args, "bench")
    wrong = [flag(n, "bench") for n in (INFERENCE_ONLY if args.train else TRAIN_ONLY) if getattr(args, n) is not None]
    if wrong:
        raise ValueError(f"{', '.join(wrong)} {'do' if len(wrong) > 1 else 'does'} not apply "
                         + ("to --train (training steps)" if args.train else "without --train (prefill and decode)")
                         + "; drop " + ("them" if len(wrong) > 1 else "it")
                         + ("" if args.train else " or add --train"))
    for name, default in TRAIN_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.train and args.steps < 1:
        raise ValueError(f"--steps {args.steps}: give at least 1 timed step")
    return EvalSettings(**given)


def run_bench(args) -> int:
    settings = bench_settings(args)
    check_model_spec(args.model)
    check_model_spec(settings.baseline)
    offline_if_unreachable(args.model, settings.baseline)
    threads.note()
    from t2r.eval import bench, load_pair
    from t2r.eval.models import eval_dtype
    from t2r.eval.suite import labels

    device = default_device(settings.device)
    if args.train:
        return run_train_bench(args, settings, device)
    dtype = eval_dtype(settings.dtype, device)
    model, _, baseline, _, baseline_spec = load_pair(args.model, settings.baseline, dtype, device)
    rows = []
    for name, m in zip(labels(model, baseline), (model, baseline)):
        if m is not None:
            rows += bench.bench_model(m, name, settings.bench_contexts, settings.bench_batch_sizes,
                                      settings.bench_decode_tokens, repeats=settings.bench_repeats, seed=settings.seed,
                                      allow_beyond=True,  # speed and memory, whatever the quality there
                                      decode=settings.bench_decode)
    table = bench.format_table(rows)
    print_and_write(args.out, f"{device}, {dtype}, {settings.bench_decode} decode", table, rows, bench.plot)
    return 0


def print_and_write(out_dir: str | None, title: str, table: str, rows: list, plot) -> None:
    """Print a bench table; with `out_dir`, write it (bench.md, with the command), every row (bench.json) and
    the plots `plot(rows, out_dir)` makes."""
    from dataclasses import asdict

    print(f"{title}\n{table}")
    if not out_dir:
        return
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.md").write_text(f"`t2r {' '.join(sys.argv[1:])}` on {title}\n\n{table}\n")
    (out / "bench.json").write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    try:
        paths = plot(rows, out)
        print(f"wrote {out / 'bench.md'}, {out / 'bench.json'}, " + ", ".join(str(p) for p in paths))
    except ImportError as err:
        print(f"plots skipped: {err}")


def run_train_bench(args, settings, device: str) -> int:
    """`t2r bench --train`: training tokens/s and peak memory, model and baseline side by side."""
    from t2r.eval import load_pair
    from t2r.eval.suite import labels
    from t2r.eval.train_bench import bench_training, format_train_table, plot_training

    tokens_per_step = args.tokens_per_step or max(settings.bench_contexts)
    dtype = "float32" if settings.dtype == "auto" else settings.dtype  # master weights, as finetune keeps them
    model, _, baseline, _, _ = load_pair(args.model, settings.baseline, dtype, device)
    names = labels(model, baseline)
    rows = []
    for name, m in zip(names, (model, baseline)):
        if m is not None:
            rows += bench_training(m, name, settings.bench_contexts, tokens_per_step, steps=args.steps)
    precision = f"{dtype} weights" + (", bf16 autocast" if device.startswith("cuda") else "")
    print_and_write(args.out, f"{device}, {precision}, {tokens_per_step} tokens per step, training",
                    format_train_table(rows, reference=names[1]), rows, plot_training)
    return 0
