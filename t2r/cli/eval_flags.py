"""`t2r eval` and `t2r bench` flags, generated from the fields of `t2r.eval.settings.EvalSettings`.

A setting has one name: the field in a recipe's `eval:` section, `--field-name` on `t2r eval`; `t2r bench`
(whose every flag is about the bench) drops the `bench_` prefix (`bench_contexts` is `t2r bench --contexts`).
Help, choices and defaults come from the field (through `t2r.cli.flags`); a flag left out stays None, so the
dataclass's default is the only one. Spellings of earlier versions stay as hidden aliases (`OLD_FLAGS`).
"""

from __future__ import annotations

import argparse
import typing
from dataclasses import fields

from t2r.cli import values
from t2r.cli.flags import add_setting_flag, kind
from t2r.cli.flags import default_text as default_text  # the default as --help words it (tests read it here)
from t2r.eval.quick import COSTS

OLD_FLAGS = {"eval": {"suites": ["--suite"], "bench_contexts": ["--contexts"], "bench_batch_sizes": ["--batch-sizes"],
                      "lm_eval_max_length": ["--max-length"]}}
"""Flags of earlier versions, per command: still accepted, not shown in --help."""
BENCH_COMMAND_SETTINGS = ("baseline", "device", "dtype", "seed")
"""The settings outside the bench group that `t2r bench` takes too."""
INFERENCE_ONLY = ("bench_batch_sizes", "bench_decode_tokens", "bench_repeats", "bench_decode")
TRAIN_ONLY = ("tokens_per_step", "steps")
TRAIN_DEFAULTS = {"steps": 3}


def flag(name: str, command: str) -> str:
    """The flag of setting `name` on `command` (`eval` or `bench`)."""
    return "--" + (name.removeprefix("bench_") if command == "bench" else name).replace("_", "-")


def settings_fields(command: str):
    """(field, its type's kind) of every setting `command` takes a flag for."""
    from t2r.eval.settings import EvalSettings

    hints = typing.get_type_hints(EvalSettings)
    for f in fields(EvalSettings):
        if command == "eval" or f.metadata["group"] == "bench" or f.name in BENCH_COMMAND_SETTINGS:
            yield f, kind(hints[f.name])


def add_settings_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """One flag per setting `command` takes, in the settings' groups, default None (unset)."""
    from t2r.eval.settings import GROUPS

    groups = {}
    for f, field_kind in settings_fields(command):
        group = f.metadata["group"]
        if group not in groups:
            groups[group] = parser.add_argument_group(GROUPS[group]) if command == "eval" else parser
        add_setting_flag(groups[group], f, field_kind, flag=flag(f.name, command), parser=parser,
                         old=tuple(OLD_FLAGS.get(command, {}).get(f.name, [])))


def given_settings(args, command: str) -> dict:
    """The settings given on the command line (the flags not left out), by field name."""
    return {f.name: getattr(args, f.name) for f, _ in settings_fields(command) if getattr(args, f.name) is not None}


def add_eval_parsers(commands) -> None:
    evaluate = commands.add_parser(
        "eval", help="evaluate a (converted) model against its source: perplexity by position, recall, lm-eval, speed",
        description="Score --model and --baseline on the same inputs and write report.md, results.json and PNG "
                    "plots to --out. Suites: ppl (perplexity by position, with sliding-window baselines), mqar and "
                    "passkey (synthetic recall), bench (speed and memory), and lm-eval suites (commonsense, "
                    "knowledge, aggregate, recall, local). Every setting below is also a field of a recipe's eval: "
                    "section, by the same name.", epilog=COSTS)
    evaluate.add_argument("--model", default="smollm2",
                          help="model to evaluate: directory, hub id, file.gguf or 'smollm2' (default: smollm2)")
    evaluate.add_argument("--out", required=True, help="directory for report.md, results.json and plots")
    add_settings_flags(evaluate, "eval")

    bench = commands.add_parser(
        "bench", help="prefill, decode or training speed and memory against context length, model vs baseline",
        description="Prefill tokens/s, decode ms/token and tokens/s, cache and peak memory for every context and "
                    "batch size; with --train, training tokens/s and peak memory for every context. Out-of-memory "
                    "is reported as OOM and the sweep goes on. The flags are t2r eval's bench settings, without "
                    "their bench- prefix.")
    bench.add_argument("--model", default="smollm2",
                       help="model to measure: directory, hub id, file.gguf or 'smollm2' (default: smollm2)")
    add_settings_flags(bench, "bench")
    bench.add_argument("--train", action="store_true",
                       help="time training steps instead (tokens/s and peak memory per context; fp32 weights with "
                            "bf16 autocast on CUDA unless --dtype is given, AdamW over every parameter)")
    bench.add_argument("--tokens-per-step", type=values.one_size, default=None,
                       help="--train: tokens per step, as rows of each context (default: the largest context)")
    bench.add_argument("--steps", type=int, default=None,
                       help=f"--train: timed steps per context, after one warm-up (default: {TRAIN_DEFAULTS['steps']})")
    bench.add_argument("--out", default=None, help="directory for bench.md, bench.json and plots")
