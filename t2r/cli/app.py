"""`t2r`: parse the command line and run the command, turning expected failures into messages and exit codes."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

from t2r.cli import threads
from t2r.cli.cache import run_cache
from t2r.cli.convert import run_convert, run_rank_layers
from t2r.cli.evaluate import run_bench, run_eval
from t2r.cli.generate import run_generate
from t2r.cli.parser import build_parser
from t2r.cli.train import run_export, run_finetune, run_run

_PACKAGE = str(Path(__file__).resolve().parents[1])


def _as_note(show):
    """`warnings.showwarning` that prints t2r's own warnings as one `note:` line (the library warns a Python user;
    the command line says it as its other notes), and leaves the others to `show`."""
    if getattr(show, "as_note", False):  # main() called again in one process
        return show

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if str(Path(filename).resolve()).startswith(_PACKAGE):
            say(f"note: {message}")
        else:
            show(message, category, filename, lineno, file, line)
    showwarning.as_note = True
    return showwarning


def say(line: str) -> None:
    """`line` on stderr in one write: the processes of a launch share the stream, and a line written in two
    parts (text, then newline) could take another process's line between them."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def parse(argv: list[str] | None):
    """The command line; `section.field=value` overrides may also follow the flags (`finetune --config R --resume
    train.max_steps=7`), where argparse alone stops taking positionals."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and getattr(args, "overrides", None) is not None and all(
            "=" in item and not item.startswith("-") for item in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.parse_args(argv)  # argparse's own one-line error for what it does not know
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    threads.choose()  # before torch loads: no more CPU threads than the machine has free
    warnings.showwarning = _as_note(warnings.showwarning)
    handlers = {"convert": run_convert, "finetune": run_finetune, "run": run_run, "generate": run_generate,
                "eval": run_eval, "bench": run_bench, "cache": run_cache, "rank-layers": run_rank_layers,
                "export": run_export}
    try:
        if args.command == "cache":
            return run_cache(args)
        if args.command in ("finetune", "run"):  # a bad recipe is answered before any library loads (no torch)
            from t2r.train.recipe import load_recipe

            args.recipe = load_recipe(args.config, args.overrides)
        from t2r.outputs import quiet_libraries

        with quiet_libraries():  # one progress bar per long step of ours, none of the libraries' per-load bars
            return handlers[args.command](args)
    except (ValueError, OSError) as err:  # bad option, unsupported model, missing file or unreachable hub id
        say(f"t2r {args.command}: error: {err}")
        return 2
    except RuntimeError as err:
        from t2r.train.errors import RunError

        if not isinstance(err, RunError):
            raise
        # a run that stopped on purpose: busy directory, damaged checkpoints, nan loss, a signal. A signal stops
        # every process of a launch alike: the main one says so (their lines interleaved in one log)
        if not (hasattr(err, "exit_code") and os.environ.get("RANK", "0") != "0"):
            say(f"t2r {args.command}: {'' if hasattr(err, 'exit_code') else 'error: '}{err}")
        return getattr(err, "exit_code", 1)
    except KeyboardInterrupt:  # Ctrl-C outside training (a training run stops after its step, see t2r.train.signals)
        say(f"t2r {args.command}: interrupted")
        return 130
    finally:
        leave_process_group()


def leave_process_group() -> None:
    """The command's process group (under `accelerate launch` / `torchrun`), left before the process ends, as
    torch asks (NCCL warns of leaked resources otherwise); nothing where none was formed."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
