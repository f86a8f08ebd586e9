"""`t2r finetune` and `t2r run` (finetune, then evaluate), and their dry-run plan."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from t2r.cli import threads
from t2r.cli.common import default_device
from t2r.paths import offline_if_unreachable
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
    from accelerate import PartialState

    from t2r.train import finetune

    metrics = finetune(recipe, resume=args.resume, overwrite=args.overwrite)
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
    from t2r.eval.suite import HELD_OUT

    settings, cuts = shrink(settings)  # eval.limit: the quick look's sizes
    data = (f"the recipe's {recipe.data.held_out} held-out documents" if settings.data == HELD_OUT else
            settings.data or "generated long documents")
    suites = ", ".join([*settings.suites, *settings.tasks]) or "none"
    return (f"# eval: then {recipe.checkpoint.dir}/final against {settings.baseline or recipe.model.source} "
            f"(suites: {suites}; perplexity data: {data}, {counted(settings.ppl_rows, 'row')} of "
            f"{settings.ppl_length:,} tokens{'; a quick look: ' + '; '.join(cuts) if cuts else ''}), on "
            f"{settings.device or 'cuda if available, else cpu'}; report in {recipe.checkpoint.dir}/eval/")


def run_run(args) -> int:
    from t2r.eval.settings import HELD_OUT, EvalSettings

    recipe = loaded_recipe(args)  # the eval section is validated here too (no torch yet)
    settings = recipe.eval or EvalSettings(suites=["ppl"])
    check_eval_lengths(recipe, settings)  # before training: the eval must fit the model it will load
    if args.dry_run:
        check_recipe_data(recipe)
        print_plan(recipe, args.tokens_per_second, args.measure)
        print(eval_plan(recipe, settings))
        return 0
    threads.note()
    from accelerate import PartialState

    from t2r.cli.evaluate import add_card_evaluation
    from t2r.eval import evaluate, load_pair, write_report
    from t2r.eval.models import eval_dtype
    from t2r.train import finetune

    metrics = finetune(recipe, resume=args.resume, overwrite=args.overwrite)
    if not PartialState().is_main_process:
        return 0
    release_host_memory()  # the evaluation must not stack on the training's freed memory (4.4 -> 4.0 GB on CPU)
    final = f"{recipe.checkpoint.dir}/final"
    device = default_device(settings.device)
    settings.dtype = eval_dtype(settings.dtype, device)
    model, tokenizer, baseline, baseline_tokenizer, baseline_spec = load_pair(
        final, settings.baseline or recipe.model.source, settings.dtype, device)
    data = None
    if settings.data == HELD_OUT:
        data = recipe.data.data_config()
    out = f"{recipe.checkpoint.dir}/eval"
    print(f"finetuned {metrics['step']} steps; evaluating {final} against {baseline_spec} into {out}")
    results = evaluate(model, tokenizer, settings, out, baseline=baseline, baseline_tokenizer=baseline_tokenizer,
                       model_spec=final, baseline_spec=baseline_spec, data=data, data_seed=recipe.train.seed,
                       command=" ".join(["t2r", *sys.argv[1:]]))
    report = write_report(results, out)
    add_card_evaluation(final, report.parent / "results.json")  # the card's evaluation, read from results.json
    print(report.read_text(), end="")
    print(f"model saved to {final}; report written to {report}")
    return 0


def check_eval_lengths(recipe, settings) -> None:
    """The `eval:` section's lengths against the trained model and the baseline, from their configs alone (a config
    that cannot be read, an offline hub id, is left to the evaluation itself). A config t2r has built in
    (`known_config`: the 7B recipes' sources) is read without the hub, as the plan does; another hub id is
    looked up after `offline_if_unreachable` (an offline machine retried the hub for 24 s here)."""
    from t2r.eval.contenders import length_limit
    from t2r.eval.suite import check_length_limits
    from t2r.models.known_configs import known_config
    from t2r.sources import load_config

    def config(spec):
        known = known_config(spec)
        if known is not None:
            return known
        offline_if_unreachable(spec)
        return load_config(spec)

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


def check_recipe_data(recipe) -> None:
    """The data checks of `finetune` for `--dry-run`, which loads nothing: the first documents of every local
    file, then, when the tokenizer is a local directory, one packed row of each part. A real run leaves them to
    `finetune`, which makes them once, before the model loads."""
    from t2r.data.check import check_files, check_rows
    from t2r.data.documents import is_local
    from t2r.sources import load_tokenizer

    cfg = recipe.data.data_config()
    check_files(cfg)
    source = Path(recipe.model.source).expanduser()
    if is_local(os.path.expanduser(cfg.path)) and (source / "tokenizer_config.json").is_file():
        check_rows(cfg, load_tokenizer(str(source)), recipe.data.seq_len, recipe.train.seed)


def _divides(recipe, processes: int) -> bool:
    train = recipe.train
    return train.tokens_per_step % (recipe.data.seq_len * train.micro_batch_size * processes) == 0
