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


def without_tied_copies(model, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state_dict` without the entries `model` ties to another (SmolLM2's output head is its input embedding).
    `save_pretrained` drops a tied entry only where both share storage; FSDP gathers each as a copy of its own, so
    a two-card `final/` also held `lm_head.weight` (113 MB more for SmolLM2, read back as the same tensor). An entry
    whose copy no longer equals its tie's is kept: loading re-ties it, but nothing is dropped that differs."""
    tied = model.get_expanded_tied_weights_keys(all_submodels=True) if hasattr(
        model, "get_expanded_tied_weights_keys") else {}
    copies = {key for key, source in tied.items() if key in state_dict and source in state_dict
              and state_dict[key] is not state_dict[source] and torch.equal(state_dict[key], state_dict[source])}
    return {key: value for key, value in state_dict.items() if key not in copies} if copies else state_dict


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
    state_dict = without_tied_copies(unwrapped, state_dict)

    def write(tmp: Path) -> None:
        unwrapped.save_pretrained(tmp, state_dict=state_dict)
        tokenizer.save_pretrained(tmp)
        write_extra(tmp)

    out = root / "final"  # a resumed finished run: the earlier final/ stays until this one is in place
    with disk_full_stops(staging_dir(out), "the final model", "the checkpoints are intact"):
        return write_model_dir(out, write)


def export_checkpoint(checkpoint, out=None, made_by: str = "t2r.train.export.export_checkpoint") -> Path:
    """A step checkpoint as a model directory, for a run cut short before its end: the model is rebuilt from the
    checkpoint's own recipe (the same conversion; an `auto:N` layer choice read back from the run's
    `layer_ranking/`, never ranked again) and given the checkpoint's weights, every tensor accounted for and
    finite (LoRA adapters merged, as in `final/`). `out` defaults to `<run>/export-<checkpoint>`; an existing
    directory is never replaced. Returns the directory."""
    from dataclasses import replace

    from safetensors.torch import load_file

    from t2r.convert.layer_spec import auto_softmax_count

    from . import checkpoint as checkpoints
    from .errors import CheckpointError
    from .model_setup import build_model
    from .recipe import load_recipe

    checkpoint = Path(checkpoint)
    problem = checkpoints.verify(checkpoint)
    if problem:
        raise CheckpointError(f"{checkpoint}: {problem}; export another checkpoint of the run")
    weights = checkpoint / "model.safetensors"
    if not weights.is_file():
        raise ValueError(f"{checkpoint} holds no model.safetensors (a sharded FSDP checkpoint): resume the run on "
                         "the same processes until it writes final/")
    out = Path(out) if out is not None else checkpoint.parent / f"export-{checkpoint.name}"
    if out.exists():
        raise ValueError(f"{out} exists: give another --out (an export never replaces a model directory)")
    recipe = load_recipe(checkpoint / "recipe.yaml", check_files=False)
    recipe = replace(recipe, checkpoint=replace(recipe.checkpoint, dir=str(checkpoint.parent)))
    if auto_softmax_count(recipe.convert.layers) is not None and not (
            checkpoint.parent / "layer_ranking" / "ranking.json").is_file():
        raise ValueError(f"{checkpoint.parent}/layer_ranking/ranking.json is missing: the run chose its softmax "
                         f"layers by it (convert.layers={recipe.convert.layers}); ranking again could choose others")
    model, tokenizer, _ = build_model(recipe, teacher=False)  # the student alone
    state = load_file(weights)
    expected = set(model.state_dict())
    tied = {key for key in expected if key.endswith("lm_head.weight")} if model.config.tie_word_embeddings else set()
    missing, unexpected = expected - set(state) - tied, set(state) - expected
    if missing or unexpected:
        raise CheckpointError(f"{weights} does not fit the recipe's model: missing {sorted(missing)[:5]}, "
                              f"unexpected {sorted(unexpected)[:5]}")
    if hasattr(model, "get_base_model"):  # peft: the adapters merged into the weights, as in final/
        state, model = merged_lora_state_dict(model, state), model.get_base_model()
    else:
        model.load_state_dict(state, strict=False)
        state = None  # save_pretrained takes the model's own (tied weights as transformers saves them)
    if not all(bool(torch.isfinite(t).all()) for t in (state.values() if state is not None else model.parameters())):
        raise CheckpointError(f"{weights} holds non-finite weights: export an earlier checkpoint")
    step = checkpoints.read_state(checkpoint)

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, state_dict=state)
        tokenizer.save_pretrained(tmp)
        (tmp / "recipe.yaml").write_bytes((checkpoint / "recipe.yaml").read_bytes())

    training = {"recipe": recipe.name, "stages": [s.name for s in recipe.stage_list], "steps": step.get("step"),
                "tokens": step.get("tokens"), "data": recipe.data.path, "held_out_loss": None}
    return write_model_dir(out, write, made_by=made_by, training=training)
