"""The trained model as `<checkpoint.dir>/final`: a complete model directory any loader reads (weights,
config, tokenizer, resolved recipe, and `manifest.json` with every file's size and SHA-256, which loading
checks), written to a hidden directory and renamed into place (`t2r.model_dir`, as every model directory). A LoRA run
saves its adapters merged into the weights (W + scaling * B @ A, the trained copies of the fully trained
modules in place of the originals), so `final/` loads like any converted model."""

from __future__ import annotations

from pathlib import Path

import torch

from t2r.model_dir import staging_dir, write_model_dir

from .disk import disk_full_stops

PEFT_PREFIX = "base_model.model."


def merged_lora_state_dict(peft_model, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The base model's state dict with every LoRA adapter of `peft_model` merged in, from a full state dict
    of it (`accelerator.get_state_dict`, so this works on gathered FSDP weights too)."""
    from peft.tuners.lora import LoraLayer

    scaling = {}
    for name, module in peft_model.named_modules():
        if isinstance(module, LoraLayer) and "default" in module.scaling:
            if module.use_dora.get("default") or getattr(module, "fan_in_fan_out", False):
                raise ValueError(f"{name}: merging DoRA / fan_in_fan_out adapters is not supported")
            scaling[name] = module.scaling["default"]
    merged = {}
    for key, value in state_dict.items():
        if ".lora_" in key or ".original_module." in key:  # adapters (merged below), frozen originals
            continue
        if ".base_layer." in key:
            module = key.split(".base_layer.")[0]
            if key.endswith(".base_layer.weight") and module in scaling:
                a, b = state_dict[f"{module}.lora_A.default.weight"], state_dict[f"{module}.lora_B.default.weight"]
                value = value + (scaling[module] * (b.float() @ a.float())).to(value.dtype)
            key = key.replace(".base_layer.", ".")
        key = key.replace(".modules_to_save.default.", ".")
        merged[key.removeprefix(PEFT_PREFIX)] = value
    return merged


def save_final(accelerator, model, tokenizer, root: Path, write_extra) -> Path:
    """Write `root/final` atomically from the prepared `model`. Every process must call this
    (gathering the state dict is collective); the main process writes."""
    state_dict = accelerator.get_state_dict(model)
    if not accelerator.is_main_process:
        return root / "final"
    unwrapped = accelerator.unwrap_model(model)
    if hasattr(unwrapped, "get_base_model"):  # peft
        state_dict = merged_lora_state_dict(unwrapped, state_dict)
        unwrapped = unwrapped.get_base_model()
    def write(tmp: Path) -> None:
        unwrapped.save_pretrained(tmp, state_dict=state_dict)
        tokenizer.save_pretrained(tmp)
        write_extra(tmp)

    out = root / "final"  # a resumed finished run: the earlier final/ stays until this one is in place
    with disk_full_stops(staging_dir(out), "the final model", "the checkpoints are intact"):
        return write_model_dir(out, write)
