"""A tiny source model with a character tokenizer, a small corpus, and recipes over them."""

import json
import textwrap

import pytest
from safetensors.torch import load_file

from t2r.train import load_recipe
from tests.data.conftest import char_tokenizer
from tests.models.conftest import tiny_source

SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "a journey of a thousand miles begins with a single step",
    "all that glitters is not gold and not all who wander are lost",
    "to be or not to be that is the question",
    "the early bird catches the worm but the second mouse gets the cheese",
]


def save_char_source(path):
    """A tiny random Llama with a character tokenizer, saved at `path` like a hub checkpoint."""
    tokenizer = char_tokenizer()
    tiny_source("llama", vocab_size=len(tokenizer)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def source_dir(tmp_path_factory):
    return save_char_source(tmp_path_factory.mktemp("source"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    rows = [{"text": f"{SENTENCES[i % 5]} {SENTENCES[(3 * i + 1) % 5]}", "source": "test"} for i in range(60)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def recipe(tmp_path, source_dir, corpus, run="run", **overrides):
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


def final_weights(recipe_):
    return load_file(f"{recipe_.checkpoint.dir}/final/model.safetensors")


def torchrun_failure(stderr: str) -> str:
    """What a failed torchrun printed: every line naming an error, from any rank (the rank that failed first
    is often far from the end, behind the others' teardown), then the tail."""
    errors = [line for line in stderr.splitlines() if "Error" in line or "error:" in line][:60]
    return "torchrun failed; error lines:\n" + "\n".join(errors) + "\n--- last 3000 characters ---\n" + stderr[-3000:]
