"""The model a recipe trains: source loaded, converted (or not, for the baseline), and the
trainable parameters chosen (all, attention, the new gates only, or LoRA through peft)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from torch import nn

from t2r.convert import calibrated_convert
from t2r.dtypes import torch_dtype
from t2r.layers.base import ATTENTION_PROJECTIONS, REUSED_MODULES, ConvertedAttention
from t2r.models.compilation import compile_layers
from t2r.sources import load_source


def _added_children(attention: ConvertedAttention) -> dict[str, nn.Module]:
    """The parameterised submodules conversion added to one attention module (its gates), by name."""
    return {name: child for name, child in attention.named_children()
            if name not in REUSED_MODULES and any(True for _ in child.parameters())}


def new_modules(attention: ConvertedAttention) -> nn.ModuleList:
    """The gates conversion added to one attention module."""
    return nn.ModuleList(_added_children(attention).values())


def new_module_names(model: nn.Module) -> list[str]:
    """Names (relative to their attention module) of the parameterised submodules conversion added:
    GSA's slot gate, GLA's low-rank gate, FoX's forget gate; RetNet adds none."""
    return sorted({name for module in model.modules() if isinstance(module, ConvertedAttention)
                   for name in _added_children(module)})


def build_model(recipe, dtype: torch.dtype | None = None, clock=None, device: torch.device | str | None = None, *,
                trainable: str | None = None, teacher: bool | None = None):
    """(model, tokenizer, teacher or None) for the recipe. Weights load in float32 unless `dtype`
    is given: under mixed precision the optimizer keeps fp32 master weights and autocast computes
    in bf16. The teacher (the unconverted source, frozen) exists when `teacher` is true (default: when the recipe
    distills or transfers attention, `Recipe.needs_teacher`); `trainable` is the set left trainable (default
    `train.trainable`, `select_trainable`). `clock` (a `StartupClock`) times the load, the calibration and the
    conversion.
    `device` (the run's, a GPU): the source moves there before it is measured, so that a layer ranking runs
    on the GPU with the mixers' kernels (on the CPU it took 156 of a 164 s start-up, SmolLM2 on an H100 machine's
    16 cores; 10 s on the GPU); the model ends there."""
    part = clock.part if clock is not None else (lambda name: contextlib.nullcontext())
    if recipe.train.compile and not _is_cuda(device) and (recipe.convert.options.get("window") or
                                                          recipe.convert.kept_window):
        raise ValueError("train.compile with a window (convert.options.window, convert.kept_window) is for CUDA: "
                         "on the CPU Inductor's code for the window's backward corrupts memory and kills the process "
                         "(torch 2.13, seen 2026-11-27); set train.compile=false here")
    dtype = dtype or (torch.float32 if recipe.train.mixed_precision != "no" else torch_dtype(recipe.model.dtype))
    with part("load"):
        source, tokenizer = load_source(recipe.model.source, dtype=dtype)
        if _is_cuda(device) and not loads_on_main_only():
            source.to(device)
    wants_teacher, teacher = recipe.needs_teacher if teacher is None else teacher, None
    if recipe.convert.target == "none":
        model = source
    else:
        teacher_dtype = torch_dtype(recipe.model.dtype)
        # one copy of the weights: the converted model takes the source's tensors, unless a teacher in the same
        # dtype would then share them (casting the teacher to another dtype gives it tensors of its own). The
        # calibration is measured on the main process only: under FSDP's RAM-efficient loading the others hold
        # no weights, and the main process's stay on the CPU until accelerate shards them, so it moves the source
        # to its GPU for the measurement and back
        ranking_device = device if _is_cuda(device) and loads_on_main_only() else None

        def measure(fn):
            with part("calibration"):
                return from_main_process(fn and (lambda: measured_on(source, ranking_device, fn)))

        with part("convert"):
            model = calibrated_convert(
                source, tokenizer, recipe.convert.target, layers=recipe.convert.layers, init=recipe.convert.init,
                data=recipe.data.data_config(), rows=recipe.convert.calibration_rows,
                length=min(recipe.convert.calibration_length, recipe.data.seq_len),
                ranking_dir=Path(recipe.checkpoint.dir) / "layer_ranking", measure=measure,
                source=recipe.model.source, copy=wants_teacher and teacher_dtype == dtype,
                rank_by=recipe.convert.rank_by, rank_sweep=recipe.convert.rank_sweep,
                kept_window=recipe.convert.kept_window, **recipe.convert.options)
        if wants_teacher:  # the loaded source itself serves as the teacher, no second load
            teacher = source.to(teacher_dtype).eval().requires_grad_(False)
    if recipe.train.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    if recipe.train.compile:
        with part("compile"):  # torch.compile's own modules imported (seconds); the graphs come at the first step
            compile_layers(model)
            if teacher is not None:
                compile_layers(teacher)
    return select_trainable(model, recipe, trainable), tokenizer, teacher


def _is_cuda(device) -> bool:
    return device is not None and torch.device(device).type == "cuda"


def measured_on(module: nn.Module, device, fn):
    """`fn()` with `module` on `device` (None: where it is), moved back to where it was afterwards."""
    if device is None:
        return fn()
    home = next(module.parameters()).device
    module.to(device)
    try:
        return fn()
    finally:
        module.to(home)


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def loads_on_main_only() -> bool:
    """True under accelerate's FSDP with `fsdp_cpu_ram_efficient_loading`: transformers reads the weights on
    the main process only (the others get zeros, never read from disk) and accelerate broadcasts the prepared
    model's weights from it."""
    from transformers.distributed.fsdp import is_fsdp_enabled

    return is_fsdp_enabled()


def from_main_process(fn):
    """`fn()` on the main process only; its result, or the error it raised, on every process (so that no
    process waits forever for one that stopped). Without a process group, simply `fn()`; `fn` may be None on
    the other processes."""
    if not _distributed():
        return fn() if fn is not None else None
    import torch.distributed as dist

    result, error = None, None
    if dist.get_rank() == 0 and fn is not None:
        try:
            result = fn()
        except Exception as err:  # noqa: BLE001 - re-raised below, on every process
            error = err
    payload = [(result, error)]
    dist.broadcast_object_list(payload, src=0)
    result, error = payload[0]
    if error is not None:
        raise error
    return result


def place_teacher(teacher: nn.Module, device) -> nn.Module:
    """Move the teacher to `device`; where only the main process loaded weights (`loads_on_main_only`), send
    them to the others, since accelerate broadcasts only the model it prepares."""
    teacher.to(device)
    if _distributed() and loads_on_main_only():
        import torch.distributed as dist

        with torch.no_grad():
            for tensor in teacher.state_dict().values():
                dist.broadcast(tensor, src=0)
    return teacher


def select_trainable(model: nn.Module, recipe, trainable: str | None = None) -> nn.Module:
    """Freeze what `trainable` (default: the recipe's `train.trainable`) does not train. `lora` wraps the model
    with peft: adapters on `lora.target_modules`, the new gates trained in full (`modules_to_save`)."""
    mode = trainable or recipe.train.trainable
    if mode == "lora":
        from peft import LoraConfig, get_peft_model

        lora = recipe.lora
        targets = lora.target_modules or attention_projections(model)
        check_lora_targets(model, targets)
        config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=list(targets),
                            modules_to_save=new_module_names(model) or None)
        return get_peft_model(model, config)
    if mode == "all":
        model.requires_grad_(True)
        return model
    gates = new_module_names(model)
    if mode == "gates" and not gates:
        raise ValueError(f"train.trainable=gates: the {recipe.convert.target!r} layers add no parameters "
                         "(RetNet has no gates); choose all, attention or lora")
    for name, param in model.named_parameters():
        in_attention = ".self_attn." in name
        is_gate = in_attention and any(f".self_attn.{g}." in name for g in gates)
        param.requires_grad_(is_gate if mode == "gates" else in_attention)
    return model


def attention_projections(model: nn.Module) -> list[str]:
    """The names of the attention projections `model` has (the default LoRA targets)."""
    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    return [name for name in ATTENTION_PROJECTIONS if name in present]


def check_lora_targets(model: nn.Module, targets) -> None:
    """Every `lora.target_modules` entry must name modules of the model (peft itself only refuses a list
    in which none matches, and silently skips the rest)."""
    from .fields import RecipeError, suggest

    names = [name for name, _ in model.named_modules() if name]
    leaves = sorted({name.rsplit(".", 1)[-1] for name in names})
    for target in targets:
        if not any(name == target or name.endswith("." + target) for name in names):
            raise RecipeError(f"lora.target_modules: {target!r} matches no module of the model"
                              f"{suggest(target, leaves, list_all=False)} (module names: "
                              f"{', '.join(n for n in leaves if not n.isdigit())})")


def trainable_parameters(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    total = sum(p.numel() for p in model.parameters())
    return sum(p.numel() for p in model.parameters() if p.requires_grad), total
