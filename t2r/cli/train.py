"""`t2r finetune` and `t2r run` (finetune, then evaluate), and their dry-run plan."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from t2r.cli import threads
from t2r.paths import offline_if_unreachable
from t2r.sources import verify_ahead
from t2r.train.readers import start_readers_early
from t2r.words import counted


def run_export(args) -> int:
    from t2r.paths import check_model_spec

    check_model_spec(args.checkpoint)  # a missing path: named before torch loads
    from t2r.train import checkpoint as checkpoints
    from t2r.train.export import export_checkpoint

    given, chosen = Path(args.checkpoint), Path(args.checkpoint)
    if not (given / checkpoints.STATE_FILE).is_file():  # a run directory: its newest intact checkpoint (only read)
        intact = [c for c in reversed(checkpoints.checkpoints(given)) if checkpoints.verify(c) is None]
        if not intact:
            raise ValueError(f"{given} is neither a checkpoint nor a run directory holding an intact one")
        chosen = intact[0]
    out = export_checkpoint(chosen, args.out, made_by=" ".join(["t2r", *sys.argv[1:]]))
    print(f"{chosen} -> {out}")
    return 0


def loaded_recipe(args):
    """The recipe of `--config` and its overrides, validated: as `t2r.cli.app` loaded it before any library
    (`args.recipe`), or loaded here."""
    recipe = getattr(args, "recipe", None)
    if recipe is None:
        from t2r.train.recipe import load_recipe

        recipe = load_recipe(args.config, args.overrides)
    return recipe


def run_finetune(args) -> int:
    recipe = loaded_recipe(args)  # validated before anything loads (or imports torch)
    if args.dry_run:
        check_recipe_data(recipe)
        print_plan(recipe, args.tokens_per_second, args.measure)
        return 0
    threads.note()
    start_readers_early(recipe.data.reader)  # its imports beside this process's own, next
    verify_ahead(recipe.model.source)  # the source's checksums, hashed beside those imports
    from accelerate import PartialState

    from t2r.train import finetune
    from t2r.train.startup import StartupClock

    clock = StartupClock(since_process_start=True)  # the start-up line counts this process's imports too
    metrics = finetune(recipe, resume=args.resume, overwrite=args.overwrite, clock=clock)
    if PartialState().is_main_process:
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items()))
        print(f"model saved to {recipe.checkpoint.dir}/final")
    return 0


def print_plan(recipe, tokens_per_second: float | None = None, measure: int | None = None) -> None:
    """`--dry-run`: the resolved recipe, the step plan, then the memory plan (`t2r.train.plan`); with `measure`,
    a short timed run first (`t2r.train.measure`), whose tokens/s the plan projects."""
    import yaml

    print(yaml.safe_dump(recipe.to_dict(), sort_keys=False), end="")
    train, seq_len = recipe.train, recipe.data.seq_len
    print(f"# plan: {counted(recipe.total_steps, 'step')} of {train.tokens_per_step:,} tokens "
          f"({recipe.total_steps * train.tokens_per_step:,} tokens); micro-batches of "
          f"{train.micro_batch_size} x {seq_len} tokens, accumulated "
          f"{recipe.grad_accum_steps(1)}x on 1 process"
          + "".join(f", {recipe.grad_accum_steps(n)}x on {n}" for n in (2, 4, 8) if _divides(recipe, n))
          + f"; checkpoints every {counted(recipe.checkpoint.every_steps, 'step')} in {recipe.checkpoint.dir}")
    alone = [n for n in (2, 4, 8) if _divides(recipe, n) and recipe.grad_accum_steps(n) == 1]
    if alone:
        print(f"# data parallel on {alone[0]} processes: each runs one micro-batch a step, and what a step costs "
              "beside its micro-batches (the read, the optimizer, the next batch's start) is shared by that one; a "
              "larger train.tokens_per_step shares it by more (DDP against one card in the README)")
    if recipe.stages is not None:
        from t2r.train.stages import describe

        print(describe(recipe))
    from t2r.models.known_configs import known_config
    from t2r.sources import load_config
    from t2r.train.plan import count_parameters, format_plan

    config = None if measure is not None else known_config(recipe.model.source)
    if config is not None:
        print(f"# memory plan from t2r's built-in copy of {recipe.model.source}'s config (no hub access needed)")
    else:
        offline_if_unreachable(recipe.model.source)
        try:
            config = load_config(recipe.model.source)
        except OSError as err:  # an unreachable hub id: the rest of the dry run stands
            print(f"# memory plan: skipped, the model config is not available ({err}); for a plan offline, set "
                  "model.source to a directory holding its config.json (on a connected machine: python -c \"from "
                  f"transformers import AutoConfig; AutoConfig.from_pretrained('{recipe.model.source}')"
                  ".save_pretrained('model-config')\")")
            return
    counts = count_parameters(recipe, config)
    measured = None
    if measure is not None:
        if tokens_per_second is not None:
            raise SystemExit("t2r: --measure and --tokens-per-second exclude each other (one measures, one is given)")
        from t2r.train.measure import format_measured, measure_throughput
        from t2r.train.plan import memory_rows

        measured = measure_throughput(recipe, steps=measure)
        tokens_per_second = measured.tokens_per_second
    print(format_plan(recipe, counts, tokens_per_second))
    if measured is not None:
        print(format_measured(measured, memory_rows(recipe, counts, world_sizes=(1,))[0]["total"]))


def eval_plan(recipe, settings) -> str:
    """What `t2r run` evaluates after finetuning, in one line."""
    from t2r.eval.quick import shrink
    from t2r.eval.settings import HELD_OUT

    settings, cuts = shrink(settings)  # eval.limit: the quick look's sizes
    data = (f"the recipe's {recipe.data.held_out} held-out documents" if settings.data == HELD_OUT else
            settings.data or "generated long documents")
    suites = ", ".join([*settings.suites, *settings.tasks]) or "none"
    return (f"# eval: then {recipe.checkpoint.dir}/final against {settings.baseline or recipe.model.source} "
            f"(suites: {suites}; perplexity data: {data}, {counted(settings.ppl_rows, 'row')} of "
            f"{settings.ppl_length:,} tokens{'; a quick look: ' + '; '.join(cuts) if cuts else ''}), on "
            f"{settings.device or 'cuda if available, else cpu'}; report in {recipe.checkpoint.dir}/eval/")


def run_run(args) -> int:
    recipe = loaded_recipe(args)  # the eval section is validated here too (no torch yet)
    if args.dry_run:
        from t2r.train.pipeline import check_eval_lengths, check_eval_rows, run_eval_settings

        settings = run_eval_settings(recipe)
        check_eval_lengths(recipe, settings)  # as the run itself does before training
        check_eval_rows(recipe, settings, fetch=False)
        check_recipe_data(recipe)
        print_plan(recipe, args.tokens_per_second, args.measure)
        print(eval_plan(recipe, settings))
        return 0
    threads.note()
    start_readers_early(recipe.data.reader)
    from t2r.train.pipeline import finetune_and_evaluate
    from t2r.train.startup import StartupClock

    done = finetune_and_evaluate(recipe, resume=args.resume, overwrite=args.overwrite,
                                 clock=StartupClock(since_process_start=True))
    if done.report is None:  # a process other than the main one: it trained, the main one evaluated
        return 0
    print(done.report.read_text(), end="")
    print(f"model saved to {done.model_dir}; report written to {done.report}")
    return 0


def check_recipe_data(recipe) -> None:
    """The data checks of `finetune` for `--dry-run`, which loads no model: rows longer than the source's
    positions, the first documents of every local file, the rows without text (counted), then, when the
    tokenizer is a local directory, one packed row of each part. A real run leaves them to `finetune`, which makes
    them once, before the model loads."""
    from t2r.data.check import check_files, check_rows, data_notes
    from t2r.data.documents import is_local
    from t2r.sources import load_tokenizer
    from t2r.train.checks import check_positions

    cfg = recipe.data.data_config()
    check_positions(recipe)
    check_files(cfg)
    note = data_notes(cfg)
    if note:
        print(note)
    source = Path(recipe.model.source).expanduser()
    if is_local(os.path.expanduser(cfg.path)) and (source / "tokenizer_config.json").is_file():
        check_rows(cfg, load_tokenizer(str(source)), recipe.data.seq_len, recipe.train.seed)


def _divides(recipe, processes: int) -> bool:
    train = recipe.train
    return train.tokens_per_step % (recipe.data.seq_len * train.micro_batch_size * processes) == 0
