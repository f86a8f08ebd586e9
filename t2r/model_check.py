"""What loading a model checks, so that damage is refused with the file named instead of loading as garbage:
a model directory against the manifest t2r wrote with it (`t2r.manifest`), a GGUF that cannot be read whole,
weights that do not match the model's tensors one for one (none missing and left at random, none unused), and
non-finite numbers in dequantized GGUF weights.

A GGUF carries no checksum of its own: a file cut short or with a damaged header is refused, but flipped bits
inside its quantized blocks can only show as non-finite weights; the built-in SmolLM2 GGUF is also checked
against its known SHA-256 (`t2r.sources`).
"""

from __future__ import annotations

from pathlib import Path

from t2r.manifest import DamagedModelError


def gguf_error(file: str | Path, err: Exception) -> DamagedModelError:
    """The one-line error for a GGUF that fails to load."""
    file = Path(file)
    size = file.stat().st_size if file.is_file() else 0
    reason = str(err).splitlines()[0] if str(err) else type(err).__name__
    return DamagedModelError(f"{file} cannot be read as a GGUF model ({size:,} bytes; {type(err).__name__}: "
                             f"{reason}): the file is truncated or damaged; download or copy it again")


def load_error(directory: str | Path, err: Exception, what: str = "model") -> DamagedModelError:
    """The one-line error for a model (or adapter) directory whose files fail to load (a damaged pickle or
    safetensors file)."""
    reason = str(err).splitlines()[0] if str(err) else ""
    return DamagedModelError(f"{directory}: cannot load the {what} ({type(err).__name__}: {reason}): a weights file "
                             "is damaged or not a model file; restore it from a copy or write it again")


def require_exact_tensors(info: dict, where: str) -> None:
    """DamagedModelError when the weights at `where` lack a tensor the model has (it would be left at its random
    initial value) or hold one it does not use. `info` is transformers' `output_loading_info`."""
    for key, what, fix in (
        ("missing_keys", "lacks", "it would be left at random initial values"),
        ("unexpected_keys", "holds", "the model has no such tensor"),
        ("mismatched_keys", "has a wrong shape for", "it would be replaced by random initial values"),
    ):
        names = sorted(str(n[0] if isinstance(n, tuple) else n) for n in info.get(key) or ())
        if names:
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            raise DamagedModelError(f"{where}: the weights file {what} {len(names)} tensor(s) of the model "
                                    f"({shown}; {fix}): the model files are damaged or do not belong together; "
                                    "restore them from a copy or write them again")


def is_adapter(path: str | Path) -> bool:
    """A peft adapter directory: an `adapter_config.json` and no model config."""
    return (Path(path) / "adapter_config.json").is_file() and not (Path(path) / "config.json").is_file()


def adapter_base(path: str | Path) -> str:
    """The base model `path/adapter_config.json` names, refused in one line when it names none or leads back to
    the adapter (itself, or an adapter based on this one: loading would recurse without end)."""
    base = _named_base(Path(path))
    chain, following = [Path(path).resolve()], Path(base).expanduser()
    while is_adapter(following):
        if following.resolve() in chain:
            raise ValueError(f"{path}/adapter_config.json names {base} as its base model, which leads back to this "
                             "adapter: set base_model_name_or_path to the model the adapter was trained on")
        chain.append(following.resolve())
        following = Path(_named_base(following)).expanduser()
    return base


def _named_base(adapter: Path) -> str:
    import json

    base = json.loads((adapter / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base or base == "None":
        raise ValueError(f"{adapter} holds only a LoRA adapter and names no base model (base_model_name_or_path is "
                         f"{base!r}; older t2r LoRA runs saved final/ so): rerun the finetune, which now saves the "
                         "merged model, or set base_model_name_or_path to the converted model it was trained on")
    return str(base)


def adapter_loaded_whole(load, path: str | Path):
    """`load()` (peft's `PeftModel.from_pretrained`), refusing an adapter file that lacks some of the adapter's
    tensors (peft only warns, and leaves them at their initial values), or that cannot be read (a pickle holding
    more than tensors, which `torch.load(weights_only=True)` refuses, a damaged file), in one line."""
    import pickle
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            model = load()
        except pickle.UnpicklingError as err:
            lines = [line.strip() for line in str(err).splitlines() if "WeightsUnpickler error:" in line]
            reason = lines[0].split("error:", 1)[1].split(" was not", 1)[0].strip() if lines else "not readable"
            raise DamagedModelError(f"{path}: the adapter's pickle holds more than tensors ({reason}), which t2r does "
                                    "not run: save the adapter as safetensors (peft's save_pretrained default) "
                                    "from a copy you trust") from None
        except Exception as err:  # noqa: BLE001 - damage shows as safetensors', torch's or peft's errors
            if isinstance(err, (ValueError, OSError)) and str(err).count("\n") == 0:
                raise
            raise load_error(path, err, "adapter") from err
    for warning in caught:
        message = str(warning.message)
        if "missing adapter keys" in message:
            names = message[message.index("[") + 1:message.rindex("]")].replace("'", "").split(", ")
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            raise DamagedModelError(f"{path}: the adapter file lacks {len(names)} tensor(s) of the adapter ({shown}; "
                                    "they would be left at their initial values): restore it from a copy")
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return model


def require_finite(model, where: str, fix: str = "download or copy it again") -> None:
    """DamagedModelError naming the first parameter holding nan or inf; `fix`: what to do about it."""
    import torch

    for name, tensor in model.named_parameters():
        if not tensor.is_floating_point() or tensor.device.type == "meta":
            continue
        # nan or inf anywhere makes the sum non-finite; a sum alone is ~20x cheaper than isfinite's bool tensor
        with torch.no_grad():
            total = tensor.sum(dtype=torch.float32)
        if not bool(torch.isfinite(total)) and not bool(torch.isfinite(tensor).all()):
            raise DamagedModelError(f"{where}: {name} holds nan or inf after loading: the file is damaged; {fix}")
