"""The finetuning loop: one code path for one GPU, DDP and FSDP (accelerate carries the
distribution, mixed precision and gradient accumulation), exact resume from atomic checkpoints."""

from __future__ import annotations

import itertools
import json
import math
import time
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from t2r.data import PackedSequences, collate_packed, load_documents

from . import checkpoint
from .model_setup import build_model, trainable_parameters
from .recipe import save_resolved
from .schedule import lr_factor
from .transfer import attention_transfer


class Interrupt(Exception):
    """Raised by a callback to stop training after a step (the last checkpoint stays valid)."""


def packed_loader(recipe, tokenizer, part: str = "train", epoch: int = 0) -> DataLoader:
    """Micro-batches of packed rows, flattened into one sequence with document boundaries. Each
    epoch shuffles the documents with its own seed (the held-out split depends on the base seed only)."""
    cfg = recipe.data.data_config()
    seed = recipe.train.seed + epoch
    rows = PackedSequences(lambda: load_documents(cfg, seed, part), tokenizer, recipe.data.seq_len)
    collate = partial(collate_packed, document_boundaries=recipe.data.document_boundaries)
    return DataLoader(rows, batch_size=recipe.train.micro_batch_size, collate_fn=collate)


def micro_batches(make_loader: Callable[[int], Iterable[dict]], device, rank: int = 0, world: int = 1,
                  skip: int = 0, epochs: int | None = None):
    """This process's micro-batches on `device`: every `world`-th of one deterministic stream of
    epochs (`make_loader(epoch)`, repeated until `epochs`, or forever), after the first `skip` (global)
    ones, which a resumed run has already trained on. (The stream is sharded here, not by accelerate's
    loader wrapper, which slices the flattened batch's `cu_seq_lens` as if they were per-example.)"""
    index = 0
    for epoch in itertools.count() if epochs is None else range(epochs):
        start = index
        for batch in make_loader(epoch):
            if index >= skip and index % world == rank:
                yield {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
            index += 1
        if index == start:
            if epoch == 0 and epochs is None:
                raise ValueError("the training data gave no full sequence: check data.path, data.text_field "
                                 "and data.held_out, or lower data.seq_len")
            return


def step_loss(model, batch: dict, teacher=None, distill=None) -> torch.Tensor:
    """Next-token loss; with a teacher, (1 - w) * next-token + w * T^2 * KL(teacher || student)
    on temperature-softened distributions (Hinton et al. 2015)."""
    out = model(**batch)
    if teacher is None:
        return out.loss
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        target = teacher(**inputs).logits.float()
    t = distill.temperature
    student = F.log_softmax(out.logits.float().flatten(0, -2) / t, -1)
    kl = F.kl_div(student, F.log_softmax(target.flatten(0, -2) / t, -1), log_target=True, reduction="batchmean")
    return (1 - distill.weight) * out.loss + distill.weight * t * t * kl


@torch.no_grad()
def evaluate_loss(model, loader: Iterable, max_batches: int = 50) -> float:
    """Mean next-token loss over up to `max_batches` batches (nan when the split is empty)."""
    was_training = model.training
    model.eval()
    losses = [model(**batch).loss.item() for batch in islice(loader, max_batches)]
    model.train(was_training)
    return sum(losses) / len(losses) if losses else float("nan")


def heldout_loss(model, recipe, tokenizer, device, rank: int = 0, world: int = 1) -> float:
    """Mean next-token loss on the recipe's held-out documents (`data.held_out`), packed as in training."""
    batches = micro_batches(partial(packed_loader, recipe, tokenizer, "validation"), device, rank, world, epochs=1)
    return evaluate_loss(model, batches)


def finetune(recipe, resume: bool = False, callbacks: Iterable[Callable[[dict], None]] = ()) -> dict:
    """Train the model of `recipe`; returns the final metrics. With `resume`, continue from the
    latest checkpoint under `recipe.checkpoint.dir` (same data position, optimizer, scheduler
    and RNG state), else start fresh. Each callback gets the metrics dict after every optimizer
    step and may raise `Interrupt` to stop."""
    from accelerate import Accelerator, PartialState
    from accelerate.state import AcceleratorState, GradientState
    from accelerate.utils import set_seed

    train = recipe.train
    root = Path(recipe.checkpoint.dir)
    cpu = not torch.cuda.is_available()  # accelerate only forms a multi-process CPU group when told (gloo)
    accum = recipe.grad_accum_steps(PartialState(cpu=cpu).num_processes)
    # a second run in one process (tests, notebooks) may use another precision or accumulation; the
    # process group (PartialState) is kept
    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    total_steps = recipe.total_steps
    accelerator = Accelerator(cpu=cpu, mixed_precision=train.mixed_precision, gradient_accumulation_steps=accum,
                              log_with=recipe.logging.trackers or None, project_dir=str(root / "logs"))
    set_seed(train.seed)

    model, tokenizer, teacher = build_model(recipe)
    params = [p for p in model.parameters() if p.requires_grad]
    n_train, n_total = trainable_parameters(model)
    optimizer = torch.optim.AdamW(params, lr=train.lr, betas=tuple(train.betas), weight_decay=train.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, partial(
        lr_factor, warmup_steps=train.warmup_steps, total_steps=total_steps, schedule=train.schedule,
        min_lr_ratio=train.min_lr_ratio))
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.register_for_checkpointing(scheduler)  # stepped once per optimizer step, on every process
    if teacher is not None:
        teacher.to(accelerator.device)

    step, tokens = 0, 0
    found = checkpoint.latest(root) if resume else None
    if found is not None:
        accelerator.load_state(str(found))
        state = checkpoint.read_state(found)
        step, tokens = state["step"], state["tokens"]
        accelerator.print(f"resumed from {found} (step {step}, {tokens:,} tokens)")
    elif checkpoint.latest(root) is not None:
        accelerator.print(f"starting afresh in {root}: its checkpoints will be replaced (--resume continues them)")
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        save_resolved(recipe, root)
    if recipe.logging.trackers:
        accelerator.init_trackers(recipe.name, config=_flat(recipe))

    accelerator.print(f"training {n_train:,} of {n_total:,} parameters for {total_steps} steps "
                      f"({accum} micro-batches of {train.micro_batch_size} x {recipe.data.seq_len} tokens "
                      f"x {accelerator.num_processes} processes per step)")
    history = _read_history(root / "metrics.jsonl", step) if accelerator.is_main_process else []
    world, rank = accelerator.num_processes, accelerator.process_index
    stage1 = recipe.stages.attention_transfer
    transfer_mse = None
    if stage1 is not None and step == 0:  # a resumed run's weights already hold stage 1
        stage_batches = micro_batches(partial(packed_loader, recipe, tokenizer, "train"), accelerator.device,
                                      rank, world)
        with accelerator.autocast():
            transfer_mse = attention_transfer(
                accelerator.unwrap_model(model), teacher, stage_batches, stage1.steps, stage1.lr,
                reduce_grads=(lambda g: accelerator.reduce(g, "mean")) if world > 1 else None)
        accelerator.print(f"attention transfer: {len(transfer_mse)} steps, "
                          f"MSE {transfer_mse[0]:.4g} -> {transfer_mse[-1]:.4g}")
    progress = _progress(total_steps, step, accelerator.is_main_process)
    model.train()
    window_loss, window_tokens, window_start = 0.0, 0, time.perf_counter()
    metrics = {"step": step, "tokens": tokens}
    batches = micro_batches(partial(packed_loader, recipe, tokenizer, "train"), accelerator.device, rank, world,
                            skip=step * accum * world)
    for batch in batches:
        if step >= total_steps:
            break
        with accelerator.accumulate(model):
            loss = step_loss(model, batch, teacher if recipe.stages.distill else None, recipe.stages.distill)
            accelerator.backward(loss)
            if accelerator.sync_gradients and train.grad_clip:
                accelerator.clip_grad_norm_(params, train.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        window_loss += loss.detach().float().item() / accum
        window_tokens += batch["input_ids"].numel() * accelerator.num_processes
        if not accelerator.sync_gradients:
            continue
        scheduler.step()
        step += 1
        tokens += window_tokens
        if world > 1:  # log the mean over processes, not this process's share
            window_loss = accelerator.reduce(torch.tensor(window_loss, device=accelerator.device), "mean").item()
        elapsed = time.perf_counter() - window_start
        metrics = {"step": step, "tokens": tokens, "loss": window_loss, "lr": scheduler.get_last_lr()[0],
                   "tokens_per_s": window_tokens / max(elapsed, 1e-9)}
        window_loss, window_tokens, window_start = 0.0, 0, time.perf_counter()
        progress.update(1)
        progress.set_postfix(loss=f"{metrics['loss']:.3f}", lr=f"{metrics['lr']:.2e}",
                             tok_s=f"{metrics['tokens_per_s']:,.0f}")
        if accelerator.is_main_process:
            history.append(metrics)
            _append_jsonl(root / "metrics.jsonl", metrics)
        if step % recipe.logging.every_steps == 0 and recipe.logging.trackers:
            accelerator.log(metrics, step=step)
        if step % recipe.checkpoint.every_steps == 0 or step == total_steps:
            checkpoint.save(accelerator, root, {"step": step, "tokens": tokens},
                            write_extra=lambda d: save_resolved(recipe, d), keep_last=recipe.checkpoint.keep_last)
        for callback in callbacks:
            callback(metrics)
    progress.close()

    final = dict(metrics)
    if transfer_mse:
        final["attention_transfer_mse"] = [transfer_mse[0], transfer_mse[-1]]
    if recipe.data.held_out:
        final["validation_loss"] = heldout_loss(model, recipe, tokenizer, accelerator.device, rank, world)
        final["validation_ppl"] = math.exp(min(final["validation_loss"], 50))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        out = root / "final"
        accelerator.unwrap_model(model).save_pretrained(out, state_dict=accelerator.get_state_dict(model))
        tokenizer.save_pretrained(out)
        save_resolved(recipe, out)
        (root / "final_metrics.json").write_text(json.dumps(final, indent=2))
        if recipe.logging.plot:
            _plot(history, root / "loss.png", recipe.name)
    if recipe.logging.trackers:
        accelerator.end_training()
    return final


def _flat(recipe) -> dict:
    flat = {}
    for section, values in recipe.to_dict().items():
        if isinstance(values, dict):
            flat.update({f"{section}.{k}": v if isinstance(v, (int, float, str, bool)) else str(v)
                         for k, v in values.items()})
        else:
            flat[section] = values
    return flat


def _progress(total: int, start: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=start, disable=not enabled, unit="step", dynamic_ncols=True)


def _append_jsonl(path: Path, row: dict) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps(row) + "\n")


def _read_history(path: Path, up_to_step: int) -> list[dict]:
    """Metrics of earlier steps (a resumed run rewrites the file without the steps it redoes)."""
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["step"] <= up_to_step]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def _plot(history: list[dict], path: Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # plots are optional (pip install t2r[eval])
        return
    if not history:
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([r["tokens"] / 1e6 for r in history], [r["loss"] for r in history])
    ax.set(xlabel="tokens (M)", ylabel="training loss", title=title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
