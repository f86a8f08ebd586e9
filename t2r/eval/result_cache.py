"""Scores of an unchanged baseline kept on disk: the source (and its window baselines) scored for one student
is read back for the next one's report.

Where: `$T2R_CACHE/eval/` (default `~/.cache/t2r/eval`), not the run directory: every student has its own run
directory, while the students of one machine (a GPU session trains and evaluates several in turn) share one
`$T2R_CACHE`, so only there does the next student find the source's scores. `t2r cache --clear` empties it.

Key: sha256 of a JSON object of everything that decides a score: the weights' fingerprint (`fingerprint`: the
bytes of the model's files, or of its tensors), the window and sinks, dtype, device name, the exact inputs
(a digest of the token ids or recall prompts, the lm-eval tasks and their settings), the batch size, and the
t2r, torch and transformers versions (`CACHE_FORMAT` is raised when a scorer changes). A changed setting or
weight gives another key. Entries are JSON (never pickle), each holding its key, which is checked on reading; an
unreadable entry is ignored with a note and scored again.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import torch

CACHE_FORMAT = 1
MODEL_FILE_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf", ".json", ".model", ".txt", ".tiktoken")
"""Files of a model directory that decide what loads from it (weights, config, tokenizer)."""


def default_root() -> Path:
    from t2r.sources import cache_dir

    return cache_dir() / "eval"


def note(text: str) -> None:
    print(f"note: {text}", file=sys.stderr)


def _write_json(path: Path, value) -> None:
    """Write atomically: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.part")
    partial.write_text(json.dumps(value, indent=1, sort_keys=True) + "\n")
    partial.replace(path)


def _read_json(path: Path):
    """The JSON in `path`, None when absent; ValueError when unreadable."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(str(err)) from err


def digest(value) -> str:
    """sha256 of a JSON-able value (keys sorted) or of a tensor's shape, dtype and bytes."""
    h = hashlib.sha256()
    if isinstance(value, torch.Tensor):
        h.update(f"{tuple(value.shape)} {value.dtype}".encode())
        h.update(value.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    else:
        h.update(json.dumps(value, sort_keys=True, default=str).encode())
    return h.hexdigest()


class FileHashes:
    """sha256 of files, remembered in `path` (JSON) by absolute path, inode, size, modification and change time: a
    file is read again when any of them changes. Size and mtime alone were kept by a file rewritten in place with
    its mtime set back (`cp -p`, `touch -r`, rsync), and the old file's scores came back as the new one's; the
    change time (ctime) moves on every write and cannot be set back."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self.known = _read_json(path) or {}
        except ValueError as err:
            note(f"ignoring the unreadable file-hash list {path} ({err}); hashing again")
            self.known = {}

    def sha256(self, file: Path) -> str:
        file = file.resolve()
        stat = file.stat()
        seen = self.known.get(str(file))
        now = {"inode": stat.st_ino, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "ctime_ns": stat.st_ctime_ns}
        if isinstance(seen, dict) and all(seen.get(key) == value for key, value in now.items()):
            return seen["sha256"]
        h = hashlib.sha256()
        with open(file, "rb") as f:
            while chunk := f.read(1 << 24):
                h.update(chunk)
        self.known[str(file)] = {**now, "sha256": h.hexdigest()}
        _write_json(self.path, self.known)
        return h.hexdigest()


def model_files(spec: str) -> list[Path] | None:
    """The files a model spec loads from (a directory's model files, a .gguf, smollm2's dense copy); None for
    a hub id or a LoRA adapter (whose base lies elsewhere)."""
    from t2r.paths import is_local
    from t2r.sources import SMOLLM2, is_adapter, smollm2_dense

    if spec == SMOLLM2:
        spec = str(smollm2_dense())
    if not is_local(spec):
        return None
    path = Path(spec).expanduser()
    if path.is_file():
        return [path]
    if is_adapter(str(path)):
        return None
    return sorted(p for p in path.iterdir() if p.is_file() and p.suffix in MODEL_FILE_SUFFIXES)


def tensors_sha256(model: torch.nn.Module) -> str:
    """sha256 over every tensor of the state dict (name, shape, dtype, bytes)."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(digest(tensor).encode())
    return h.hexdigest()


def tokenizer_digest(tokenizer) -> str:
    """sha256 of the vocabulary, special tokens and class: what decides the ids a tokenizer makes."""
    return digest([type(tokenizer).__name__, sorted(tokenizer.get_vocab().items()),
                   getattr(tokenizer, "special_tokens_map", {}), getattr(tokenizer, "add_bos_token", None)])


class ResultCache:
    """Scores by key in `root` (None: off, every score computed)."""

    def __init__(self, root: Path | str | None):
        self.root = Path(root) if root is not None else None
        self.hits = self.misses = 0
        self._hashes = FileHashes(self.root / "file-hashes.json") if self.root is not None else None

    @property
    def enabled(self) -> bool:
        return self.root is not None

    def fingerprint(self, spec: str | None, model: torch.nn.Module, tokenizer=None) -> str:
        """The weights' (and tokenizer's) fingerprint: the sha256 of `spec`'s files (remembered by path, inode, size,
        mtime and ctime), or of the loaded tensors when there are no files to read (a hub id, an adapter)."""
        files = model_files(spec) if spec else None
        if files:
            weights = "files:" + digest([[f.name, self._hashes.sha256(f)] for f in files])
        else:
            weights = "tensors:" + tensors_sha256(model)
        return digest([weights, tokenizer_digest(tokenizer) if tokenizer is not None else None])

    def with_file_digests(self, value):
        """`value` with every string naming an existing file replaced by the file's sha256 (local task files
        count by content, not by name)."""
        if isinstance(value, dict):
            return {k: self.with_file_digests(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.with_file_digests(v) for v in value]
        if isinstance(value, str) and len(value) < 4096 and Path(value).expanduser().is_file():
            return {"file": Path(value).name, "sha256": self._hashes.sha256(Path(value).expanduser())}
        return value

    def key_parts(self, fingerprint: str, what: str, inputs, *, dtype=None, device=None, window=None,
                  sinks=0) -> dict:
        import transformers

        from t2r.version import version

        return {"format": CACHE_FORMAT, "t2r": version(), "torch": torch.__version__,
                "transformers": transformers.__version__, "weights": fingerprint, "window": window,
                "sinks": sinks if window else None, "dtype": str(dtype), "device": device_name(device),
                "what": what, "inputs": inputs}

    def path(self, parts: dict) -> Path:
        key = digest(parts)
        return self.root / "scores" / key[:2] / f"{key}.json"

    def get(self, parts: dict):
        """The stored value for `parts`, or None (absent, or unreadable: noted, then overwritten)."""
        path = self.path(parts)
        try:
            entry = _read_json(path)
            if entry is None:
                return None
            if not isinstance(entry, dict) or "value" not in entry or entry.get("key") != json.loads(
                    json.dumps(parts, default=str)):
                raise ValueError("not an entry for this key")
        except ValueError as err:
            note(f"ignoring the unreadable cache entry {path} ({err}); scoring again")
            return None
        return entry["value"]

    def put(self, parts: dict, value) -> None:
        try:
            _write_json(self.path(parts), {"key": json.loads(json.dumps(parts, default=str)), "value": value})
        except OSError as err:  # a full or read-only disk costs the reuse, not the evaluation
            note(f"could not store a score in {self.root} ({err})")

    def score(self, contender, what: str, inputs, compute):
        """`compute()` for `contender` (a JSON-able value), read back when stored under the same key. Only
        contenders with a `fingerprint` (the baseline and its windows) are stored."""
        if not self.enabled or getattr(contender, "fingerprint", None) is None:
            return compute()
        parts = self.key_parts(contender.fingerprint, what, inputs, dtype=contender.dtype, device=contender.device,
                               window=contender.window, sinks=contender.sinks)
        return self.cached(parts, compute)

    def cached(self, parts: dict, compute):
        value = self.get(parts)
        if value is not None:
            self.hits += 1
            return value
        self.misses += 1
        value = json.loads(json.dumps(compute(), default=str))  # what a hit returns: plain JSON values
        self.put(parts, value)
        return value


NO_CACHE = ResultCache(None)


def device_name(device) -> str | None:
    """`cpu`, or the GPU's name (the kernels, and so the last bits of a score, depend on it)."""
    if device is None:
        return None
    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return device.type
