"""`from_pretrained` of the converted classes checks a local directory that t2r wrote, as t2r's own loaders do
(`t2r.sources.load_source`), so that `AutoModelForCausalLM.from_pretrained(dir)` refuses damage in one line:
a file that does not match `manifest.json` (a symbolic link named with the file it leads to), a directory whose
conversion record or recipe says t2r wrote it but whose manifest is gone, weights holding nan or inf, and a
weights file lacking a tensor of the model or holding one of another shape (a re-signed manifest, a config edited
to another `num_slots`: transformers would leave the tensor at random after a warning, or raise after a
multi-line report). An adapter directory the Auto classes load onto a t2r model (`from_pretrained(adapter_dir)`)
is checked the same way when `t2r.save_adapter` wrote it. A truncated or empty weights file in a local directory
is one line naming it. A hub id, a directory t2r did not write (no manifest, no t2r record) and weights passed in
memory load as before. Where t2r's loader verified the directory just before, its files are not hashed again
(`manifest.already_verified`). For the 516 MiB SmolLM2-135M conversion on a busy 2-core CPU machine: hashing
1.9 s, the finite check 0.18 s, the load itself 0.2 s.
"""

from __future__ import annotations

import os
from pathlib import Path

from t2r import manifest
from t2r.manifest import DamagedModelError
from t2r.model_check import adapter_base, is_adapter


def local_dir(path, kwargs: dict) -> Path | None:
    """The local model directory `from_pretrained(path, **kwargs)` reads, or None (a hub id, weights given in
    memory, a GGUF file)."""
    if path is None or kwargs.get("state_dict") is not None or kwargs.get("gguf_file"):
        return None
    try:
        directory = Path(os.fspath(path)) / (kwargs.get("subfolder") or "")
    except TypeError:
        return None
    return directory if directory.is_dir() else None


def verify_before_loading(directory: Path) -> bool:
    """Check `directory` against its manifest (unless t2r's loader just did); True when t2r wrote it (its
    weights are then checked finite after loading). DamagedModelError in one line otherwise."""
    checked = manifest.already_verified(directory)  # t2r's loader just verified it: no second hashing
    if checked if checked is not None else manifest.verify_model_dir(directory, remember=False):
        return True
    record = manifest.t2r_record(directory)
    if record is not None:
        raise DamagedModelError(f"{directory}: {manifest.MANIFEST} is missing, yet {record} says t2r wrote this "
                                f"directory, so its files cannot be checked; {manifest.REWRITE}")
    return False


def from_pretrained_verified(load, path, args, kwargs):
    """`load(path, *args, **kwargs)` (the source class's `from_pretrained`), checking a local directory first
    (and the adapter transformers loads onto it, when `path` names one) and, for a directory t2r wrote, the
    loaded weights after: every tensor of the model read from the file with its shape (transformers would leave a
    missing one at random, or raise pointing at a multi-line report), none non-finite. A file that fails to load is
    one line naming the directory."""
    directory = local_dir(path, kwargs)
    adapter = (kwargs.get("adapter_kwargs") or {}).get("_adapter_model_path")  # set by the Auto classes
    checked = [directory] if directory is not None else []
    if adapter is not None and Path(os.fspath(adapter)).is_dir():
        checked.append(Path(os.fspath(adapter)))
    if directory is not None and is_adapter(directory):  # the class itself given an adapter: its base loads too
        base = Path(adapter_base(directory)).expanduser()
        checked += [base] if base.is_dir() else []
    written_by_t2r = any([verify_before_loading(d) for d in checked])  # every one checked
    if not written_by_t2r:
        return _loaded(load, path, args, kwargs, directory)
    asked_info = kwargs.get("output_loading_info", False)
    strict_shapes = not kwargs.get("ignore_mismatched_sizes", False)
    # mismatched shapes reported in the loading info (not raised after a report), which is checked below
    kwargs = {**kwargs, "output_loading_info": True, "ignore_mismatched_sizes": True}
    with quiet_load_report():
        model, info = _loaded(load, path, args, kwargs, directory)
    from t2r.model_check import require_exact_tensors, require_finite

    required = {"missing_keys": info.get("missing_keys"),
                "mismatched_keys": info.get("mismatched_keys") if strict_shapes else None,
                # a base model (AutoModel) read from a causal LM's file leaves its head unused
                "unexpected_keys": info.get("unexpected_keys") if hasattr(model, "lm_head") else None}
    require_exact_tensors(required, str(directory or adapter))
    require_finite(model, str(directory or adapter), manifest.REWRITE)
    return (model, info) if asked_info else model


def _loaded(load, path, args, kwargs, directory):
    """`load(...)`; from a local directory, an error that is not already one line naming what to fix (a truncated or
    empty safetensors file, a header that is not one) becomes one naming the directory."""
    try:
        return load(path, *args, **kwargs)
    except Exception as err:  # noqa: BLE001 - damage shows as safetensors', torch's or transformers' errors
        if directory is None or isinstance(err, (OSError, TypeError)) or (
                isinstance(err, ValueError) and "\n" not in str(err)):
            raise
        from t2r.model_check import load_error

        raise load_error(directory, err) from err


class quiet_load_report:
    """Drops transformers' multi-line load report while a t2r directory loads: what it reports (missing,
    unexpected or mis-shaped tensors) is refused in one line instead. A filter, not a raised level: transformers
    checks its tensor-parallel plan, and warns about it, when its logger's level is WARNING or above."""

    def __enter__(self):
        import logging

        self.logger = logging.getLogger("transformers.modeling_utils")
        self.logger.addFilter(self.filter)

    @staticmethod
    def filter(record) -> bool:
        return "LOAD REPORT" not in str(record.msg)

    def __exit__(self, *exc):
        self.logger.removeFilter(self.filter)
