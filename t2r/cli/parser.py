"""The `t2r` argument parser: every command, its flags and their parsing.

Imports nothing heavy: `t2r --help`, `t2r <command> --help`, `--version` and argument errors answer at once."""

from __future__ import annotations

import argparse

from t2r.cli.convert_flags import add_convert_flags
from t2r.cli.eval_flags import add_eval_parsers
from t2r.dtypes import DTYPE_NAMES
from t2r.version import version

DTYPES = ("auto", *DTYPE_NAMES)
"""--dtype names; `auto` keeps the checkpoint's dtype (float32 for a GGUF)."""


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """The --dry-run plan's inputs, shared by `t2r finetune` and `t2r run`."""
    parser.add_argument("--tokens-per-second", type=float, default=None,
                        help="with --dry-run: measured training tokens/s per GPU, to project wall time and GPU-hours")
    parser.add_argument("--measure", type=int, default=None, metavar="STEPS",
                        help="with --dry-run: train STEPS micro-batches here (after one warm-up; nothing is written) "
                             "and use the measured tokens/s and peak memory in the plan")


def add_model_argument(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument("--model", default="smollm2", help=help_text)
    parser.add_argument("--dtype", choices=DTYPES, default="auto")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="t2r", description="Turn pretrained Transformers into linear-time RNNs.")
    parser.add_argument("--version", action="version", version=f"t2r {version()}")
    commands = parser.add_subparsers(dest="command", required=True)

    convert = commands.add_parser("convert", help="swap softmax attention for a recurrent mixer and save the model")
    add_model_argument(convert, "hub id, local directory, file.gguf, or 'smollm2' (built-in default)")
    convert.add_argument("--out", required=True, help="directory for the converted model (safetensors)")
    convert.add_argument("--overwrite", action="store_true", help="replace a model already saved in --out")
    add_convert_flags(convert, "convert")

    rank = commands.add_parser(
        "rank-layers", help="rank layers by their sensitivity to conversion (for hybrids: keep the top N softmax)",
        description="Convert one layer at a time and measure KL(source || converted) per token on sample text; "
                    "writes ranking.json and ranking.png to --out. 'convert --layers auto:N' uses the same ranking.")
    add_model_argument(rank, "source model: hub id, local directory, file.gguf or 'smollm2'")
    rank.add_argument("--out", required=True, help="directory for ranking.json and ranking.png")
    rank.add_argument("--keep", type=int, default=None, help="highlight the N most sensitive layers (kept softmax)")
    add_convert_flags(rank, "rank-layers")

    finetune = commands.add_parser(
        "finetune", help="finetune a converted model from a recipe",
        description="Train from a YAML recipe (see recipes/); any field can be overridden as section.field=value.")
    finetune.add_argument("--config", required=True, help="recipe YAML, e.g. recipes/smollm2-gsa-cpu.yaml")
    finetune.add_argument("overrides", nargs="*", help="section.field=value, e.g. train.lr=1e-4 data.seq_len=512")
    finetune.add_argument("--resume", action="store_true",
                          help="continue from the newest intact checkpoint in checkpoint.dir (exact: data, optimizer, "
                               "RNG); the recipe may change only in how long to train, the lr schedule and logging")
    finetune.add_argument("--overwrite", action="store_true",
                          help="delete another run's checkpoints and final model in checkpoint.dir, then start afresh")
    finetune.add_argument("--dry-run", action="store_true",
                          help="validate the recipe, print it resolved with the step plan and a per-GPU memory plan "
                               "(DDP and FSDP, 1-8 GPUs; from the model config alone), and stop")
    add_plan_arguments(finetune)

    run = commands.add_parser(
        "run", help="convert, finetune, then evaluate against the source, from one recipe",
        description="t2r finetune, then t2r eval of the result against the source with the recipe's eval section "
                    "(default: perplexity by position on generated long documents); the report goes to "
                    "<checkpoint.dir>/eval/.")
    run.add_argument("--config", required=True, help="recipe YAML")
    run.add_argument("overrides", nargs="*", help="section.field=value")
    run.add_argument("--resume", action="store_true", help="continue the finetuning from its latest checkpoint")
    run.add_argument("--overwrite", action="store_true", help="delete another run in checkpoint.dir first")
    run.add_argument("--dry-run", action="store_true",
                     help="validate the recipe, print it resolved with the step plan, the memory plan and what the "
                          "evaluation will measure, and stop")
    add_plan_arguments(run)

    add_eval_parsers(commands)

    export = commands.add_parser(
        "export", help="write a step checkpoint of a run cut short as a model directory (a finished run has final/)")
    export.add_argument("checkpoint", help="a checkpoint directory (runs/x/step-00000180-distill), or a run directory "
                                           "for its newest intact checkpoint")
    export.add_argument("--out", default=None, help="the model directory to write (default: <run>/export-<step>)")
    generate = commands.add_parser("generate", help="generate text with a (converted) model")
    add_model_argument(generate, "converted or source model: directory, hub id, file.gguf or 'smollm2'")
    generate.add_argument("--prompt", action="append", required=True, help="repeat for a batch")
    generate.add_argument("--max-new-tokens", type=int, default=32)
    generate.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    generate.add_argument("--temperature", type=float, default=0.8)
    generate.add_argument("--top-p", type=float, default=0.95)
    generate.add_argument("--seed", type=int, default=0)

    cache = commands.add_parser(
        "cache", help="what the t2r cache ($T2R_CACHE, default ~/.cache/t2r) holds, and how to clear it",
        description="List the built-in model's files in $T2R_CACHE (default ~/.cache/t2r) with their sizes.")
    cache.add_argument("--clear", action="store_true",
                       help="delete what t2r wrote there (the next use of 'smollm2' downloads it again)")
    return parser

