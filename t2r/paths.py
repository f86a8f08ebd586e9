"""Local paths vs hub ids: the one rule every model, tokenizer and data loader of t2r follows.

A spec is a hub id only when it has the form `name` or `owner/name` (letters, digits, `-`, `_`, `.`), has no
file suffix, and `owner` is not a local directory. Anything else (`./x`, `../x`, `/x`, `~/x`, `a/b/c`, `x.jsonl`,
`x.gguf`, a glob, `data/x` where `data/` exists) is a local path: if nothing is there, the error names the path
at once, before any hub call or model load. This module imports nothing heavy, so the command line can check
its arguments before it imports torch.
"""

from __future__ import annotations

import glob
import os
import re
import socket
import sys
from pathlib import Path
from urllib.parse import urlparse

GLOB_CHARS = "*?["
FILE_SUFFIXES = (
    ".gguf", ".safetensors", ".bin", ".pt", ".pth",  # weights
    ".jsonl", ".json", ".txt", ".parquet", ".csv", ".tsv", ".arrow",  # data (t2r reads .jsonl/.json/.txt/.parquet)
    ".gz", ".bz2", ".xz", ".zst", ".zip", ".tar",  # compressed
)
"""A spec ending in one of these names a file, never a hub repository."""
_HUB_PART = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
HUB_ID_FORM = "a hub id has the form owner/name"


def has_glob(spec: str) -> bool:
    return any(c in spec for c in GLOB_CHARS)


def looks_local(spec: str) -> bool:
    """True when `spec` can only mean a local file, directory or glob (whether or not it exists)."""
    if os.path.exists(os.path.expanduser(spec)) or has_glob(spec) or spec.lower().endswith(FILE_SUFFIXES):
        return True
    parts = spec.split("/")
    if len(parts) > 2 or not all(_HUB_PART.fullmatch(p) and ".." not in p and "--" not in p for p in parts):
        return True  # ./x, ../x, /x, ~/x, a/b/c, a\b, names with spaces: not `name` or `owner/name`
    return len(parts) == 2 and os.path.isdir(parts[0])  # data/x where data/ is a local directory


def not_found(spec: str) -> FileNotFoundError:
    """The error for a local-looking `spec` with nothing there."""
    what = "no files match the pattern" if has_glob(spec) else "no such file or directory"
    if not os.path.isabs(os.path.expanduser(spec)):
        what += f" in {os.getcwd()}"
    return FileNotFoundError(f"not found: {spec} ({what}; {HUB_ID_FORM})")


def is_local(spec: str) -> bool:
    """True for an existing local file or directory, or a glob matching files; False for a hub id;
    FileNotFoundError (naming the path) for a spec that looks local and is not there."""
    path = os.path.expanduser(spec)
    if os.path.exists(path) or (has_glob(spec) and glob.glob(path, recursive=True)):
        return True
    if looks_local(spec):
        raise not_found(spec)
    return False


def check_model_spec(spec: str | None) -> None:
    """FileNotFoundError for a model argument that looks local and is missing (a .gguf must be a file);
    hub ids, the built-in `smollm2` and `none` (no baseline) pass."""
    if spec is None or spec.lower() in ("smollm2", "none"):
        return
    if is_local(spec) and spec.lower().endswith(".gguf") and not os.path.isfile(os.path.expanduser(spec)):
        raise FileNotFoundError(f"not found: {spec} (a directory, not a .gguf file)")


_OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
_went_offline: str | None = None  # why `offline_if_unreachable` set HF_HUB_OFFLINE in this process


def offline_reason() -> str | None:
    """Why the hub cannot be reached: an offline switch that is set, or an endpoint that does not answer
    (3 s); None when it answers."""
    if _went_offline:
        return _went_offline
    for var in _OFFLINE_VARS:
        if os.environ.get(var, "").strip().upper() in ("1", "ON", "YES", "TRUE"):
            return f"{var}={os.environ[var]} is set"
    return _unreachable()


def _unreachable() -> str | None:
    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = endpoint.hostname or "huggingface.co", endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError:
        return f"{host} is unreachable from this machine"
    return None


def offline_if_unreachable(*specs: str | None) -> None:
    """Before transformers loads a hub id among `specs`: when no offline switch and no proxy is set and the hub
    does not answer, set HF_HUB_OFFLINE=1 for this process and say so, so the hub cache answers at once
    instead of after ~50 s of retries. Call it before importing transformers (which reads the switch then)."""
    global _went_offline
    hub_ids = [s for s in specs if s and s.lower() not in ("smollm2", "none") and not is_local(s)]
    if not hub_ids or _went_offline or any(os.environ.get(v) for v in (*_OFFLINE_VARS, *_PROXY_VARS)):
        return
    reason = _unreachable()
    if reason:
        _went_offline = reason
        os.environ["HF_HUB_OFFLINE"] = "1"
        constants = sys.modules.get("huggingface_hub.constants")
        if constants is not None:  # imported already: it read the switch then, and the hub library asks it
            constants.HF_HUB_OFFLINE = True
        print(f"note: {reason}: loading {', '.join(map(repr, hub_ids))} from the hub cache only", file=sys.stderr)


def hub_error(spec: str, err: Exception) -> OSError:
    """`err` (a hub id `spec` that did not load) with what to do: whether the machine is offline and how to
    fix it, or, when the hub answers, what else to check."""
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    reason = offline_reason()
    if reason is None:
        return OSError(f"hub id {spec!r} did not load: {first} (the hub answers: check the id, owner/name, and "
                       "for a gated model your access: `hf auth login`)")
    if "is set" in reason:
        fix = (f"only models already in the hub cache load; unset {reason.split('=')[0]} to download {spec!r}, "
               "or pass a local directory, a .gguf file or 'smollm2' (built in)")
    else:
        fix = ("connect the machine (or set HF_ENDPOINT to a reachable mirror)"
               + ("" if _went_offline else ", run with HF_HUB_OFFLINE=1 to use models already in the hub cache")
               + ", or pass a local directory, a .gguf file or 'smollm2' (built in)")
    return OSError(f"hub id {spec!r} did not load: this machine is offline ({reason}): {fix}. ({first})")


def cache_dir(create: bool = True) -> Path:
    """t2r's cache: `$T2R_CACHE`, default `~/.cache/t2r` (the default model, evaluation scores, offline texts)."""
    path = Path(os.environ.get("T2R_CACHE", Path.home() / ".cache" / "t2r")).expanduser()
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path
