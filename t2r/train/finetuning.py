"""`finetune`: a recipe's whole run, composed of its parts (the accelerator, the data check, the run directory's
lock and start, the stages, the final model), for one GPU, DDP and FSDP alike (accelerate carries the
distribution, mixed precision and gradient accumulation), with exact resume from verified atomic checkpoints.

A run locks its checkpoint directory, checks its data before the model loads, starts afresh only in a
directory it may claim (`resume.choose_start`), trains its stages (`t2r.train.stages`; the step loop skips
optimizer steps whose loss or gradient norm is not finite, `t2r.train.steps`), and never saves non-finite
weights."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Callable, Iterable

import torch

from t2r.data.check import check_files, check_rows, data_notes
from t2r.data.fingerprint import fingerprint
from t2r.models.model_card import write_model_card
from t2r.ops.backend import prepare_triton
from t2r.outputs import quiet_libraries
from t2r.sources import load_tokenizer

from . import checkpoint, logs
from .batches import heldout_loss
from .checks import check_positions
from .errors import CollapseError, NonFiniteError
from .export import save_final
from .guard import collapsed_model
from .model_setup import from_main_process
from .readers import resolved_reader, start_readers
from .recipe import save_resolved
from .rendezvous import joined
from .resume import check_same_data, choose_start, require_run_dir
from .run_dir import RunLock
from .signals import StopOnSignal
from .stages import train_stages
from .startup import StartupClock
from .steps import require_finite, vocab_size

TRAINED = "trained.json"
"""In final/: what the weights were trained on and for how long, beside the recipe they were trained with."""


class Interrupt(Exception):
    """Raised by a callback to stop training after a step (the last checkpoint stays valid)."""


def finetune(recipe, resume: bool = False, callbacks: Iterable[Callable[[dict], None]] = (),
             overwrite: bool = False, clock: StartupClock | None = None) -> dict:
    """Train the model of `recipe`; returns the final metrics. With `resume`, continue from the newest
    intact checkpoint under `recipe.checkpoint.dir` (same data position, optimizer, schedule and RNG
    state; recipe changes checked, see `t2r.train.resume`), else start fresh, which needs a directory
    without another run's results or `overwrite` (delete them first). Each callback gets the metrics
    dict after every optimizer step and may raise `Interrupt` to stop. `clock` times the start-up (the
    command line passes one that starts with its process)."""
    if resume and overwrite:
        raise ValueError(f"--resume and --overwrite exclude each other: --resume continues the run in "
                         f"{recipe.checkpoint.dir}, --overwrite deletes it")
    clock = clock or StartupClock()
    prepare_triton()  # one Triton cache directory for this run and its resumes, before anything compiles
    accelerator = _accelerator(recipe)
    if resume:
        from_main_process(lambda: require_run_dir(Path(recipe.checkpoint.dir)))
    with quiet_libraries(), clock.part("data check"):
        note = from_main_process(lambda: _check_data(recipe))  # before the model loads and the directory is made
    if note:
        accelerator.print(note)
    lock = RunLock(recipe.checkpoint.dir) if accelerator.is_main_process else None
    try:
        note = from_main_process(lock.acquire if lock else None)
        if note:
            accelerator.print(note)
        with quiet_libraries(), StopOnSignal(accelerator.print if accelerator.is_main_process else lambda text: None):
            return _train(recipe, accelerator, resume, overwrite, callbacks, clock)
    finally:
        if lock is not None:
            lock.release()


def _accelerator(recipe):
    """The run's Accelerator. Data-parallel: DDP does not broadcast the model's buffers from rank 0 before each
    forward (its default): t2r's buffers (rotary frequencies, RetNet's decays) are built alike on every rank and
    never change, and the broadcast made the ranks meet at every micro-batch (a two-H100 profile showed each rank
    waiting 72-140 ms a micro-batch in NCCL's small-message kernels)."""
    from accelerate import Accelerator, DistributedDataParallelKwargs, PartialState
    from accelerate.state import AcceleratorState, GradientState

    cpu = not torch.cuda.is_available()  # accelerate only forms a multi-process CPU group when told (gloo)
    accum = recipe.grad_accum_steps(joined(lambda: PartialState(cpu=cpu)).num_processes)  # the group, or one line
    # a second run in one process (tests, notebooks) may use another precision or accumulation; the
    # process group (PartialState) is kept
    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    return Accelerator(cpu=cpu, mixed_precision=recipe.train.mixed_precision, gradient_accumulation_steps=accum,
                       log_with=recipe.logging.trackers or None, project_dir=str(Path(recipe.checkpoint.dir) / "logs"),
                       kwargs_handlers=[DistributedDataParallelKwargs(broadcast_buffers=False,
                                                                     bucket_cap_mb=recipe.train.gradient_bucket_mb)])


def _check_data(recipe) -> str | None:
    """Data errors before the model loads: rows longer than the source's positions, the files' first documents,
    the rows without text (returns the line that counts those skipped), then one packed row of each part."""
    check_positions(recipe)
    check_files(recipe.data.data_config())
    note = data_notes(recipe.data.data_config())
    check_rows(recipe.data.data_config(), load_tokenizer(recipe.model.source), recipe.data.seq_len, recipe.train.seed)
    return note


def _train(recipe, accelerator, resume: bool, overwrite: bool, callbacks, clock: StartupClock) -> dict:
    from accelerate.utils import set_seed

    if resolved_reader(recipe.data.reader, on_gpu=accelerator.device.type == "cuda") == "process":
        start_readers()  # its imports beside the loading and ranking below
    found, changes = from_main_process(lambda: choose_start(recipe, resume, overwrite, accelerator.print))
    data_files = from_main_process(lambda: fingerprint(recipe.data.data_config()))
    write_recipe = lambda d: save_resolved(recipe, d)  # noqa: E731
    if found is not None:
        from_main_process(lambda: check_same_data(found, data_files))
        trained = checkpoint.read_state(found)["step"]
        if trained >= recipe.total_steps:  # the recipe's asked-for changes trained nothing: keep what did
            stored = (found / "recipe.yaml").read_text()
            write_recipe = lambda d: (Path(d) / "recipe.yaml").write_text(stored)  # noqa: E731
            accelerator.print(f"--resume: {found.name} has trained {trained} steps, the recipe asks for "
                              f"{recipe.total_steps}: nothing to train; final/ is that model with the recipe it was "
                              "trained with")
    if accelerator.is_main_process:
        write_recipe(recipe.checkpoint.dir)
    set_seed(recipe.train.seed)
    return _finish(recipe, accelerator, *train_stages(recipe, accelerator, found, changes, callbacks, clock,
                                                      record={"data_files": data_files}), write_recipe)


def card_training(recipe, step: int, tokens: int, final: dict) -> dict:
    """What the model card says of a finetuning run (`t2r.models.model_card`)."""
    return {"recipe": recipe.name, "stages": [s.name for s in recipe.stage_list], "steps": step, "tokens": tokens,
            "data": recipe.data.path, "held_out_loss": final.get("validation_loss")}


def _provenance(directory: Path, state: dict, write_recipe) -> None:
    write_recipe(directory)
    trained = {key: state.get(key) for key in ("step", "tokens", "skipped_steps", "recipe_changes", "data_files")}
    (Path(directory) / TRAINED).write_text(json.dumps(trained, indent=1) + "\n")


def _finish(recipe, accelerator, model, tokenizer, state: dict, metrics: dict, history: list, write_recipe) -> dict:
    """After the last step: the held-out loss, the final model (with `write_recipe(dir)`'s recipe.yaml and
    `trained.json`: steps, tokens, skipped steps, recipe changes and data files as trained), final_metrics.json,
    the plot."""
    root, step, tokens = Path(recipe.checkpoint.dir), state["step"], state["tokens"]
    world, rank = accelerator.num_processes, accelerator.process_index

    require_finite(model, accelerator, step, root)
    final = dict(metrics)
    final["skipped_steps"] = state["skipped_steps"]
    kept = f"the checkpoints in {root} hold the weights as trained (t2r export RUN_DIR makes a model of one)"
    if recipe.data.held_out:
        final["validation_loss"] = heldout_loss(model, recipe, tokenizer, accelerator.device, rank, world)
        final["validation_ppl"] = math.exp(min(final["validation_loss"], 50))
        if not math.isfinite(final["validation_loss"]):  # finite weights whose forward overflows (train.lr=1e30)
            raise NonFiniteError(f"step {step}: the held-out loss is {final['validation_loss']} "
                                 f"({state['skipped_steps']} steps skipped in all), so final/ was not written. Lower "
                                 f"the learning rate and start again (--overwrite); {kept}")
        collapsed = collapsed_model(final["validation_loss"], vocab_size(accelerator.unwrap_model(model)),
                                    list(state.get("loss_watch", {}).values()), state.get("held_out_start"))
        if collapsed:
            raise CollapseError(f"step {step}: {collapsed}; final/ was not written. Lower the learning rate and start "
                                f"again (--overwrite); {kept}")
    # fewer than train.max_nonfinite_steps in a row stop nothing, but a run may end on them: one skipped last step
    # (a spike) keeps the weights of the update before it, which the held-out loss above vouches for; several in a
    # row (train.lr=1e30: every update after the first overflows its gradients), or one with nothing held out to
    # vouch for them, write no final/
    streak = state.get("skipped_in_row", 0)
    if streak > 1 or (streak == 1 and "validation_loss" not in final):
        why = (f"on {streak} non-finite steps in a row" if streak > 1 else
               "on a non-finite step, and no held-out data (data.held_out) shows the weights before it still work")
        raise NonFiniteError(f"step {step}: the run ended {why} (updates skipped; {state['skipped_steps']} in all), "
                             "so final/ was not written. Lower the learning rate and start again (--overwrite), or "
                             f"check the data and the weights' dtype; {kept}")
    accelerator.wait_for_everyone()
    out = save_final(accelerator, model, tokenizer, root, lambda d: (
        _provenance(d, state, write_recipe),
        write_model_card(d, " ".join(["t2r", *sys.argv[1:]]), card_training(recipe, step, tokens, final),
                         location=root / "final")))
    if accelerator.is_main_process:
        (root / "final_metrics.json").write_text(json.dumps(final, indent=2))
        measured = any("held_out_loss" in r and r["step"] == step for r in history)  # a finished run resumed
        if "validation_loss" in final:
            accelerator.print(f"held-out loss {final['validation_loss']:.3f} (perplexity {final['validation_ppl']:.2f})"
                              f" after step {step}, on data.held_out={recipe.data.held_out} documents")
        if "validation_loss" in final and not measured:
            history = [*history, logs.held_out_row(step, tokens, final["validation_loss"])]
            logs.append_jsonl(root / "metrics.jsonl", history[-1])
        if recipe.checkpoint.keep_last == 0:
            removed = checkpoint.remove_after_final(root, out)
            if removed:
                accelerator.print(f"checkpoint.keep_last=0: deleted {', '.join(p.name for p in removed)}, {out} is "
                                  "written (--resume cannot extend this run)")
        if recipe.logging.plot:
            skipped = logs.plot(history, root / "loss.png", recipe.name)
            if skipped:
                accelerator.print(skipped)
    if recipe.logging.trackers:
        if "validation_loss" in final:
            accelerator.log({"held_out_loss": final["validation_loss"]}, step=step)
        accelerator.end_training()
    return final
