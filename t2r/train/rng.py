"""Random number generator states of one process, saved without pickle: Python's and NumPy's as JSON,
torch's (CPU and every CUDA device) as uint8 tensors in safetensors. accelerate's own `random_states_N.pkl`
needs unpickling to restore, so checkpoints hold these files instead."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import torch


def files(rank: int) -> tuple[str, str]:
    return f"rng-{rank}.json", f"rng-{rank}.safetensors"


def save(directory: Path, rank: int) -> None:
    from safetensors.torch import save_file

    as_json, as_tensors = files(rank)
    version, state, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    (directory / as_json).write_text(json.dumps({
        "python": {"version": version, "state": list(state), "gauss_next": gauss},
        "numpy": {"kind": kind, "keys": keys.tolist(), "pos": int(pos), "has_gauss": int(has_gauss),
                  "cached_gaussian": float(cached)},
    }))
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors.update({f"cuda.{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    save_file(tensors, str(directory / as_tensors))


def restore(directory: Path, rank: int) -> None:
    from safetensors.torch import load_file

    as_json, as_tensors = files(rank)
    states = json.loads((directory / as_json).read_text())
    py = states["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss_next"]))
    npy = states["numpy"]
    np.random.set_state((npy["kind"], np.array(npy["keys"], dtype=np.uint32), npy["pos"], npy["has_gauss"],
                         npy["cached_gaussian"]))
    tensors = load_file(str(directory / as_tensors))
    torch.set_rng_state(tensors["torch"])
    cuda = [tensors[f"cuda.{i}"] for i in range(len(tensors) - 1) if f"cuda.{i}" in tensors]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda[:torch.cuda.device_count()])


def reseed(seed: int) -> None:
    """A fresh, reproducible state for Python, NumPy and torch (when a checkpoint has no state for this process)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
