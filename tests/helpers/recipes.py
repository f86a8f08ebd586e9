"""Tiny finetuning set-ups: a small corpus and recipes over a saved tiny source, and what a run leaves behind."""

import socket
import textwrap

from safetensors.torch import load_file

from t2r.train import load_recipe
from t2r.train.recipe import Recipe
from tests.helpers.data import write_jsonl

SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "a journey of a thousand miles begins with a single step",
    "all that glitters is not gold and not all who wander are lost",
    "to be or not to be that is the question",
    "the early bird catches the worm but the second mouse gets the cheese",
]


def write_corpus(path):
    """60 documents, each two of `SENTENCES`, as JSON lines at `path`; returns `path`."""
    return write_jsonl(path, [{"text": f"{SENTENCES[i % 5]} {SENTENCES[(3 * i + 1) % 5]}", "source": "test"}
                              for i in range(60)])


def recipe(tmp_path, source_dir, corpus, run="run", **overrides):
    """A 6-step GSA recipe on the tiny source and corpus (the `source_dir` and `corpus` fixtures), checkpoints in
    `tmp_path / run`; `overrides` are `section.field=value` pairs given as keywords."""
    text = textwrap.dedent(f"""
        name: tiny
        model: {{source: "{source_dir}", dtype: float32}}
        convert: {{target: gsa, options: {{num_slots: 8}}}}
        data: {{path: "{corpus}", seq_len: 32, held_out: 4}}
        train: {{lr: 3.0e-3, warmup_steps: 2, tokens_per_step: 128, micro_batch_size: 2, max_steps: 6,
                 mixed_precision: "no", seed: 0}}
        checkpoint: {{dir: "{tmp_path / run}", every_steps: 3, keep_last: 2}}
        logging: {{every_steps: 1, plot: false}}
    """)
    path = tmp_path / f"{run}.yaml"
    path.write_text(text)
    return load_recipe(path, [f"{k}={v}" for k, v in overrides.items()])


BASE_OVERRIDES = ["model.source=smollm2", "convert.target=gsa", "data.path=org/dataset",
                  "train.tokens_per_step=4096", "train.max_steps=10"]


def make_recipe(*overrides, check_files=True) -> Recipe:
    """A recipe from command-line overrides alone, on top of `BASE_OVERRIDES` (nothing loads)."""
    return load_recipe(None, ["name=t", *BASE_OVERRIDES, *overrides], check_files=check_files)


def final_weights(recipe_):
    return load_file(f"{recipe_.checkpoint.dir}/final/model.safetensors")


def torchrun_failure(stderr: str) -> str:
    """What a failed torchrun printed: every line naming an error, from any rank (the rank that failed first
    is often far from the end, behind the others' teardown), then the tail."""
    errors = [line for line in stderr.splitlines() if "Error" in line or "error:" in line][:60]
    return "torchrun failed; error lines:\n" + "\n".join(errors) + "\n--- last 3000 characters ---\n" + stderr[-3000:]


def free_port() -> int:
    """A TCP port free on this machine now, for a torchrun launch's --master_port: fixed ports collided when two
    launches ran at once (another test run on the same machine, or parallel test workers)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(args: list[str], env: dict, timeout: float = 300):
    """`python -m torch.distributed.run --nproc_per_node 2 --master_port P *args` (subprocess.run's result), on a
    port free a moment before; launched again on another where that port was taken in between (EADDRINUSE:
    parallel test workers' launches and gloo's own connections draw from the same ports)."""
    import subprocess
    import sys

    for _ in range(3):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
               str(free_port()), *args]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        if done.returncode == 0 or "EADDRINUSE" not in done.stderr:
            return done
    return done
