"""Model directories as t2r writes them, from the library and the command line alike.

A directory is filled aside (`.tmp-<name>` next to it): weights, config and tokenizer, any records, the model
card (`README.md`), file modes as the umask gives them, and `manifest.json` last (every file's size and SHA-256,
which loading checks); then it takes the place of the old one in one step, which stays until the new one is
complete. `save_converted` is what `t2r convert` writes; `t2r finetune`'s `final/` and the default model's dense
copy use `write_model_dir` too; `save_adapter` writes a peft adapter directory the same way.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

from t2r import manifest
from t2r.outputs import follow_umask, real_path, replace_dir

CONVERSION_FILE = "t2r_conversion.json"
"""Written next to the weights of a fresh conversion: the model is converted, not trained."""
ADAPTER_FILE = "t2r_adapter.json"
"""Written next to the weights of an adapter `save_adapter` saved: t2r wrote it (so it has a manifest)."""


def staging_dir(out) -> Path:
    """The hidden directory a model directory `out` is written in before it takes `out`'s place (beside the
    directory a symbolic link `out` leads to: on its filesystem, so it can be swapped in)."""
    out = real_path(out)
    return out.with_name(f".tmp-{out.name}")


def write_model_dir(out, write: Callable[[Path], None], *, made_by: str | None = None, location=None,
                    started: bool = False, training: dict | None = None) -> Path:
    """Write the model directory `out` atomically: `write(tmp)` fills `staging_dir(out)` (emptied first, unless
    `started`: the caller already put files there); then the model card (with `made_by`, the command or call
    that made it, and `training`, what the model card says of its training), the umask's file modes and the
    manifest; then it replaces `out`. Returns `out`."""
    from t2r.models.model_card import write_model_card

    out, tmp = Path(out), staging_dir(out)
    if not started:
        shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True, exist_ok=True)
    write(tmp)
    if made_by is not None:
        write_model_card(tmp, made_by, training, location=location or out)
    follow_umask(tmp)  # safetensors writes model.safetensors 0600
    manifest.write(tmp)  # last: loading checks every file against it
    replace_dir(tmp, out)
    return out


def save_converted(model, tokenizer, out, *, source: str | None = None, target: str | None = None,
                   made_by: str = "t2r.save_converted", converted_by: str = "t2r.save_converted",
                   started: bool = False) -> Path:
    """Save a freshly converted `model` (and its `tokenizer`) as `t2r convert` does: weights, config,
    tokenizer, the conversion record (`CONVERSION_FILE`: not trained yet), the model card and the manifest, so
    that `t2r generate`, `t2r finetune` and `from_pretrained` read it the same whichever made it. `made_by`:
    the command (or call) the card and the record name; `started`: `staging_dir(out)` already holds files to
    keep (the command line's layer ranking)."""
    mixers = sorted(set(getattr(model.config, "t2r_mixers", None) or []) - {"softmax"})
    record = {"converted_by": converted_by, "source": source or getattr(model.config, "t2r_source", None),
              "target": target or "+".join(mixers) or None, "trained": False, "command": made_by}

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / CONVERSION_FILE).write_text(json.dumps(record, indent=1) + "\n")

    return write_model_dir(out, write, made_by=made_by, started=started)


def save_adapter(model, out, *, base: str | None = None, tokenizer=None, made_by: str = "t2r.save_adapter") -> Path:
    """Save the adapters of a peft `model` as peft does (safetensors and `adapter_config.json`), naming `base`
    (the model they were trained on; default: the one peft recorded) as their base, with the tokenizer if given,
    t2r's record (`ADAPTER_FILE`) and a manifest, so that t2r's loaders refuse a damaged copy."""
    out = Path(out)
    peft_config = model.peft_config[model.active_adapter]
    base = str(base or peft_config.base_model_name_or_path or "")
    if not base or base == "None" or Path(base).expanduser().resolve() == out.resolve():
        raise ValueError(f"{out}: the adapter needs the model it was trained on as its base (base_model_name_or_path "
                         f"is {base!r}): pass base='<converted model directory or hub id>' to save_adapter")

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        config = json.loads((tmp / "adapter_config.json").read_text())
        (tmp / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": base}, indent=2))
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        (tmp / ADAPTER_FILE).write_text(json.dumps({"saved_by": made_by, "base": base}, indent=1) + "\n")

    return write_model_dir(out, write)
