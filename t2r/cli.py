"""`t2r` command line: convert | finetune | run | generate (eval and bench follow the same pattern)."""

from __future__ import annotations

import argparse
import sys
import time

import torch

from t2r.layers import FEATURE_MAPS, MIXERS

DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def add_model_argument(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument("--model", default="smollm2", help=help_text)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="auto")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="t2r", description="Turn pretrained Transformers into linear-time RNNs.")
    commands = parser.add_subparsers(dest="command", required=True)

    convert = commands.add_parser("convert", help="swap softmax attention for a recurrent mixer and save the model")
    add_model_argument(convert, "hub id, local directory, file.gguf, or 'smollm2' (built-in default)")
    convert.add_argument("--to", dest="target", choices=MIXERS, required=True)
    convert.add_argument("--out", required=True, help="directory for the converted model (safetensors)")
    convert.add_argument("--layers", default=None, help="layers to convert, e.g. '0-11,15' (default: all)")
    convert.add_argument("--num-slots", type=int, default=None, help="GSA memory slots per kv head (default 64)")
    convert.add_argument("--feature-map", choices=FEATURE_MAPS, default=None)
    convert.add_argument("--rope", type=_bool, default=None, help="keep RoPE on q/k (default true)")
    convert.add_argument("--output-norm", type=_bool, default=None)
    convert.add_argument("--gate-logit-normalizer", type=float, default=None)

    finetune = commands.add_parser(
        "finetune", help="finetune a converted model from a recipe",
        description="Train from a YAML recipe (see recipes/); any field can be overridden as section.field=value.")
    finetune.add_argument("--config", required=True, help="recipe YAML, e.g. recipes/smollm2-gsa-cpu.yaml")
    finetune.add_argument("overrides", nargs="*", help="section.field=value, e.g. train.lr=1e-4 data.seq_len=512")
    finetune.add_argument("--resume", action="store_true",
                          help="continue from the latest checkpoint in checkpoint.dir (exact: data, optimizer, RNG)")
    finetune.add_argument("--dry-run", action="store_true",
                          help="validate the recipe, print it resolved with the step plan, and stop")

    run = commands.add_parser(
        "run", help="convert, finetune and compare with the source on held-out text, from one recipe",
        description="t2r finetune, then the held-out loss and perplexity of the source model and of the result "
                    "side by side (the recipe needs data.held_out > 0). lm-eval tasks are not run yet.")
    run.add_argument("--config", required=True, help="recipe YAML")
    run.add_argument("overrides", nargs="*", help="section.field=value")
    run.add_argument("--resume", action="store_true", help="continue the finetuning from its latest checkpoint")

    generate = commands.add_parser("generate", help="generate text with a (converted) model")
    add_model_argument(generate, "converted or source model: directory, hub id, file.gguf or 'smollm2'")
    generate.add_argument("--prompt", action="append", required=True, help="repeat for a batch")
    generate.add_argument("--max-new-tokens", type=int, default=32)
    generate.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    generate.add_argument("--temperature", type=float, default=0.8)
    generate.add_argument("--top-p", type=float, default=0.95)
    generate.add_argument("--seed", type=int, default=0)
    return parser


def default_device(requested: str | None) -> str:
    return requested or ("cuda" if torch.cuda.is_available() else "cpu")


def run_convert(args) -> int:
    import t2r
    from t2r.sources import load_source

    source, tokenizer = load_source(args.model, dtype=DTYPES[args.dtype], device=default_device(args.device))
    options = {k: v for k, v in dict(
        num_slots=args.num_slots, feature_map=args.feature_map, rope=args.rope,
        output_norm=args.output_norm, gate_logit_normalizer=args.gate_logit_normalizer,
    ).items() if v is not None}
    model = t2r.convert(source, args.target, layers=args.layers, **options)
    print(t2r.conversion_report(source, model))
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    print(f"saved to {args.out}")
    return 0


def run_generate(args) -> int:
    from t2r.sources import load_source

    device = default_device(args.device)
    model, tokenizer = load_source(args.model, dtype=DTYPES[args.dtype], device=device)
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


def run_finetune(args) -> int:
    from t2r.train import finetune, load_recipe

    from accelerate import PartialState

    recipe = load_recipe(args.config, args.overrides)  # validated before anything loads
    if args.dry_run:
        import yaml

        print(yaml.safe_dump(recipe.to_dict(), sort_keys=False), end="")
        train, seq_len = recipe.train, recipe.data.seq_len
        print(f"# plan: {recipe.total_steps:,} steps of {train.tokens_per_step:,} tokens "
              f"({recipe.total_steps * train.tokens_per_step:,} tokens); micro-batches of "
              f"{train.micro_batch_size} x {seq_len} tokens, accumulated "
              f"{recipe.grad_accum_steps(1)}x on 1 process"
              + "".join(f", {recipe.grad_accum_steps(n)}x on {n}" for n in (2, 4, 8) if _divides(recipe, n))
              + f"; checkpoints every {recipe.checkpoint.every_steps} steps in {recipe.checkpoint.dir}")
        return 0
    metrics = finetune(recipe, resume=args.resume)
    if PartialState().is_main_process:
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items()))
        print(f"model saved to {recipe.checkpoint.dir}/final")
    return 0


def run_run(args) -> int:
    import math

    from accelerate import PartialState

    from t2r.sources import load_source
    from t2r.train import finetune, heldout_loss, load_recipe

    recipe = load_recipe(args.config, args.overrides)
    if not recipe.data.held_out:
        raise ValueError("t2r run compares held-out loss: set data.held_out to a number of documents (e.g. 64)")
    metrics = finetune(recipe, resume=args.resume)
    if not PartialState().is_main_process:
        return 0
    device = default_device(None)
    source, tokenizer = load_source(recipe.model.source, dtype=torch.float32, device=device)
    rows = [(f"source ({recipe.model.source})", heldout_loss(source, recipe, tokenizer, device)),
            (f"{recipe.convert.target}, finetuned {metrics['step']} steps", metrics["validation_loss"])]
    print(f"held-out loss on {recipe.data.held_out} documents of {recipe.data.path}:")
    print("| model | loss | perplexity |\n|---|---|---|")
    for name, loss in rows:
        print(f"| {name} | {loss:.4f} | {math.exp(min(loss, 50)):.2f} |")
    print(f"model saved to {recipe.checkpoint.dir}/final")
    return 0


def _divides(recipe, processes: int) -> bool:
    train = recipe.train
    return train.tokens_per_step % (recipe.data.seq_len * train.micro_batch_size * processes) == 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handlers = {"convert": run_convert, "finetune": run_finetune, "run": run_run, "generate": run_generate}
    try:
        return handlers[args.command](args)
    except (ValueError, OSError) as err:  # bad option, unsupported model, missing file or unreachable hub id
        print(f"t2r {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
