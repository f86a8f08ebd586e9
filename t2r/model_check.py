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


def load_error(directory: str | Path, err: Exception) -> DamagedModelError:
    """The one-line error for a model directory whose files fail to load (a damaged pickle or safetensors file)."""
    reason = str(err).splitlines()[0] if str(err) else ""
    return DamagedModelError(f"{directory}: cannot load the model ({type(err).__name__}: {reason}): a weights file "
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


def adapter_loaded_whole(load, path: str | Path):
    """`load()` (peft's `PeftModel.from_pretrained`), refusing an adapter file that lacks some of the adapter's
    tensors (peft only warns, and leaves them at their initial values)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = load()
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
