"""`t2r eval` and `t2r bench` (inference and, with --train, training)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from t2r.cli.common import default_device
from t2r.paths import check_model_spec, offline_if_unreachable


def eval_settings(args):
    from t2r.eval import EvalSettings

    suites = args.suite if args.suite is not None else ([] if args.tasks else ["ppl", "mqar", "passkey"])
    return EvalSettings(
        baseline=args.baseline, suites=suites, tasks=args.tasks, limit=args.limit, data=args.data, text_field=args.text_field,
        ppl_length=args.ppl_length[0], ppl_rows=args.ppl_rows, pack=args.pack, windows=args.windows, sinks=args.sinks,
        mqar_pairs=args.mqar_pairs, passkey_lengths=args.passkey_lengths, passkey_depths=args.passkey_depths,
        lm_eval_max_length=args.max_length, bench_contexts=args.contexts, bench_batch_sizes=args.batch_sizes,
        batch_size=args.batch_size, seed=args.seed, device=args.device, dtype=args.dtype)


def run_eval(args) -> int:
    check_model_spec(args.model)
    check_model_spec(args.baseline)
    offline_if_unreachable(args.model, args.baseline)
    from t2r.eval import evaluate, load_pair, write_report
    from t2r.eval.models import eval_dtype

    settings = eval_settings(args)
    settings.harness_specs()  # unknown task or suite: fail before loading anything
    device = default_device(args.device)
    settings.dtype = eval_dtype(args.dtype, device)
    model, tokenizer, baseline, baseline_tokenizer, baseline_spec = load_pair(args.model, settings.baseline,
                                                                              settings.dtype, device)
    results = evaluate(model, tokenizer, settings, args.out, baseline=baseline, baseline_tokenizer=baseline_tokenizer,
                       model_spec=args.model, baseline_spec=baseline_spec, command=" ".join(["t2r", *sys.argv[1:]]))
    report = write_report(results, args.out)
    print(report.read_text(), end="")
    print(f"report written to {report} (every number in {report.parent / 'results.json'})")
    return 0


BENCH_DEFAULTS = {"batch_sizes": [1], "decode_tokens": 16, "decode": "eager", "steps": 3}
INFERENCE_ONLY, TRAIN_ONLY = ("batch_sizes", "decode_tokens", "decode"), ("tokens_per_step", "steps")


def check_bench_flags(args) -> None:
    """ValueError for a flag of the other mode (`--decode` with `--train`, `--steps` without it): it would
    be ignored. Then the unset flags take their defaults."""
    wrong = [name for name in (INFERENCE_ONLY if args.train else TRAIN_ONLY) if getattr(args, name) is not None]
    if wrong:
        flags = ", ".join("--" + name.replace("_", "-") for name in wrong)
        raise ValueError(f"{flags} {'do' if len(wrong) > 1 else 'does'} not apply "
                         + ("to --train (training steps)" if args.train else "without --train (prefill and decode)")
                         + "; drop " + ("them" if len(wrong) > 1 else "it")
                         + ("" if args.train else " or add --train"))
    for name, default in BENCH_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.train and args.steps < 1:
        raise ValueError(f"--steps {args.steps}: give at least 1 timed step")


def run_bench(args) -> int:
    check_bench_flags(args)
    check_model_spec(args.model)
    check_model_spec(args.baseline)
    offline_if_unreachable(args.model, args.baseline)
    from t2r.eval import bench, load_pair
    from t2r.eval.models import eval_dtype
    from t2r.eval.suite import labels

    device = default_device(args.device)
    if args.train:
        return run_train_bench(args, device)
    dtype = eval_dtype(args.dtype, device)
    model, _, baseline, _, baseline_spec = load_pair(args.model, args.baseline, dtype, device)
    rows = []
    for name, m in zip(labels(model, baseline), (model, baseline)):
        if m is not None:
            rows += bench.bench_model(m, name, args.contexts, args.batch_sizes, args.decode_tokens,
                                      allow_beyond=True,  # speed and memory, whatever the quality there
                                      decode=args.decode)
    table = bench.format_table(rows)
    print_and_write(args.out, f"{device}, {dtype}, {args.decode} decode", table, rows, bench.plot)
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


def run_train_bench(args, device: str) -> int:
    """`t2r bench --train`: training tokens/s and peak memory, model and baseline side by side."""
    from t2r.eval import load_pair
    from t2r.eval.suite import labels
    from t2r.eval.train_bench import bench_training, format_train_table, plot_training

    tokens_per_step = args.tokens_per_step or max(args.contexts)
    dtype = "float32" if args.dtype in (None, "auto") else args.dtype  # master weights, as finetune keeps them
    model, _, baseline, _, _ = load_pair(args.model, args.baseline, dtype, device)
    names = labels(model, baseline)
    rows = []
    for name, m in zip(names, (model, baseline)):
        if m is not None:
            rows += bench_training(m, name, args.contexts, tokens_per_step, steps=args.steps)
    precision = f"{dtype} weights" + (", bf16 autocast" if device.startswith("cuda") else "")
    print_and_write(args.out, f"{device}, {precision}, {tokens_per_step} tokens per step, training",
                    format_train_table(rows, reference=names[1]), rows, plot_training)
    return 0
