"""One process of a two-process `t2r finetune` whose rank 1 finds its disk full at its second checkpoint (its RNG
states, the one part of a checkpoint every process writes): run under torchrun by tests/train/test_distributed.py."""

import errno
import os
import sys

from t2r.cli import main
from t2r.train import rng

real_save, saves = rng.save, []


def save(path, rank):
    saves.append(path)
    if os.environ.get("RANK") == "1" and len(saves) == 2:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))
    return real_save(path, rank)


rng.save = save
sys.exit(main(sys.argv[1:]))
