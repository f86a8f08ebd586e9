"""What `t2r eval` (and the eval of `t2r run`) measures: `EvalSettings`, one field per setting.

Each field is a `t2r.settings.setting` (as `t2r.layers.options.MixerOptions` and
`t2r.convert.settings.ConvertSettings` are); a recipe's `eval:` section
sets the fields by name, and `t2r eval` / `t2r bench` generate their flags from them (`t2r.cli.eval_flags`),
so a setting has one name and one default everywhere. This module imports neither torch nor transformers:
`t2r eval --help` reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

from t2r.dtypes import DTYPE_NAMES
from t2r.settings import COUNT_MAX, LENGTH_MAX, SEED_MAX, STEPS_MAX, check_settings, setting

BUILTIN_SUITES = ("ppl", "kl", "mqar", "passkey", "bench")
DEFAULT_SUITES = ("ppl", "mqar", "passkey")
HELD_OUT = "held-out"
"""`data` value in a recipe's eval section: the recipe's own held-out documents (`data.held_out`)."""
DECODE_MODES = ("eager", "static")
FRONTIER_WINDOWS = (32, 64, 128, 256, 512, 1024)
EVAL_DTYPES = ("auto", *DTYPE_NAMES)
NEEDED_LISTS = {"mqar_pairs": "mqar", "passkey_lengths": "passkey", "passkey_depths": "passkey",
                "bench_contexts": "bench", "bench_batch_sizes": "bench"}
"""List settings a suite cannot run without a value of (an empty one divided by zero, or measured nothing)."""
GROUPS = {
    "what": "what to measure",
    "ppl": "perplexity by position, against sliding-window baselines",
    "recall": "synthetic recall (mqar, passkey)",
    "lm-eval": "lm-eval tasks",
    "bench": "speed and memory (the bench suite; t2r bench drops the bench- prefix)",
}
"""Flag groups of `t2r eval --help`, in order (each field names its group)."""


def parse_sizes(text: str) -> list[int]:
    """"1K,2K,512" -> [1024, 2048, 512] (K or k = 1024); a ValueError names the bad item."""
    sizes = []
    for item in text.split(","):
        item = item.strip()
        digits, factor = (item[:-1], 1024) if item[-1:] in ("K", "k") else (item, 1)
        if not digits.isdigit() or int(digits) <= 0:
            raise ValueError(f"bad size {item!r} in {text!r}: expected a positive integer, optionally with K (=1024)")
        sizes.append(int(digits) * factor)
    return sizes


@dataclass
class EvalSettings:
    """What to measure and how much of it; every field has a default that runs on a laptop CPU."""

    baseline: str | None = setting(
        None, "model to compare with: directory, hub id, file.gguf or smollm2; 'none': no baseline (e.g. when "
              "the source is scored once for several students)", "what",
        default_text="the source a converted model records")
    suites: list[str] = setting(
        list(DEFAULT_SUITES), "ppl, kl (KL to the baseline by position, on the perplexity rows), mqar, passkey, "
                              "bench, and lm-eval suites (commonsense, knowledge, aggregate, recall, local)", "what",
        default_text=f"{','.join(DEFAULT_SUITES)}; with --tasks alone: only the tasks")
    tasks: list[str] = setting([], "lm-eval task names or local multiple-choice .jsonl files / directories", "what")
    students: list[str] = setting([], "other models (e.g. earlier students) scored on the same perplexity and recall "
                                      "inputs, drawn as points against the window frontier", "what")
    limit: int | None = setting(None, "a quick look: at most N perplexity rows, prompts per recall cell and lm-eval "
                                      "documents per task, and every suite shrunk to about two minutes on 2 CPU "
                                      "cores for a 135M model (rows and passkey prompts of at most 512 tokens, one "
                                      "window baseline and the memory-matched one, two MQAR cells, one passkey "
                                      "depth: the needle farthest back); the report lists the cuts", "what", min=1,
                                max=STEPS_MAX)
    batch_size: int = setting(1, "rows per forward (perplexity, recall, lm-eval)", "what", min=1, max=COUNT_MAX)
    seed: int = setting(0, "seed of the held-out sample, the recall prompts, lm-eval and the bench ids", "what",
                        min=0, max=SEED_MAX)
    device: str | None = setting(None, "cpu, cuda, cuda:1 ...", "what", default_text="cuda if available")
    dtype: str = setting("auto", "dtype both models are scored in; auto: float32 on CPU, bfloat16 on GPUs", "what",
                         choices=EVAL_DTYPES)
    cache: bool = setting(True, "reuse the baseline's scores (and its windows') from $T2R_CACHE/eval when its "
                                "weights, inputs and settings are unchanged, and store new ones; the model is "
                                "always scored", "what")

    data: str | None = setting(
        None, "held-out text for perplexity (and kl): local file, directory or hub dataset id, or several joined "
              "by commas (A,B: each scored and judged against the windows on its own, e.g. the training corpus's "
              f"held-out part and text of another domain); in a recipe, '{HELD_OUT}': the recipe's held-out "
              "documents", "ppl", default_text="generated long documents")
    data_documents: int = setting(256, "how many held-out documents to read from --data", "ppl", min=1,
                                  max=LENGTH_MAX)
    text_field: str = setting("text", "the JSON field holding the text in --data", "ppl")
    ppl_length: int = setting(2048, "tokens per perplexity row (e.g. 2K)", "ppl", min=2,  # 1: nothing to predict
                              max=LENGTH_MAX)
    ppl_rows: int = setting(16, "perplexity rows", "ppl", min=1, max=LENGTH_MAX)
    pack: bool = setting(False, "join documents end to end (EOS between) instead of using documents at least "
                                "--ppl-length long", "ppl")
    windows: list[int] = setting(list(FRONTIER_WINDOWS),
                                 "window baselines: the baseline restricted to its last W tokens (plus the sinks); "
                                 "scored on perplexity and recall, they draw the window frontier (frontier.png)",
                                 "ppl", min=1, max=LENGTH_MAX)
    sinks: int = setting(4, "sink tokens (the sequence's first) kept by each window baseline", "ppl", min=0,
                         max=COUNT_MAX)

    mqar_pairs: list[int] = setting([8, 32, 64], "MQAR: key-value pairs per prompt, one cell each", "recall",
                                      min=1, max=COUNT_MAX)
    mqar_prompts: int = setting(8, "MQAR: prompts per cell", "recall", min=1, max=COUNT_MAX)
    passkey_lengths: list[int] = setting([512, 1024, 2048, 4096], "passkey: prompt lengths in tokens", "recall",
                                           min=1, max=LENGTH_MAX)
    passkey_depths: list[float] = setting([0.0, 0.25, 0.5, 0.75, 1.0],
                                          "passkey: needle depths (0: start, 1: end)", "recall", min=0, max=1)
    passkey_prompts: int = setting(2, "passkey: prompts per (length, depth) cell", "recall", min=1, max=COUNT_MAX)

    lm_eval_max_length: int = setting(2048, "lm-eval max_length (the same for both models)", "lm-eval",
                                       min=1, max=LENGTH_MAX)
    lm_eval_limit: int | None = setting(None, "lm-eval documents per task (per subtask of a group)", "lm-eval",
                                        default_text="all", min=1, max=STEPS_MAX)

    bench_contexts: list[int] = setting([512, 1024, 2048], "context lengths, e.g. 1K,2K,8K", "bench", min=1,
                                        max=LENGTH_MAX)
    bench_batch_sizes: list[int] = setting([1], "batch sizes, e.g. 1,16,64", "bench", min=1, max=COUNT_MAX)
    bench_decode_tokens: int = setting(16, "decode steps per cell", "bench", min=1, max=LENGTH_MAX)
    bench_repeats: int = setting(3, "timed repeats per cell, after one warm-up run", "bench", min=1, max=1000)
    bench_decode: str = setting(
        "eager", "eager: the model's own cache through its forward (what generate() does); static: static "
                 "buffers, a CUDA graph per step for converted fixed-state models and a compiled StaticCache "
                 "forward for sources (framework overhead removed)", "bench", choices=DECODE_MODES)

    def __post_init__(self):
        self.check()

    def harness_specs(self):
        """The lm-eval tasks asked for (`t2r.eval.harness.TaskSpec`s), validated against lm-eval's index."""
        from t2r.eval import harness

        if not self.harness_asked():
            return []
        suites = [s for s in self.suites if s not in BUILTIN_SUITES]
        return harness.resolve_tasks(",".join(suites) or None, list(self.tasks))

    def check(self) -> None:
        """Raise ValueError naming the bad field, before anything loads: the bounds and choices each field
        declares (`t2r.settings.check_settings`), then the held-out texts."""
        check_settings(self)
        for name, suite in NEEDED_LISTS.items():
            if suite in self.suites and not getattr(self, name):
                raise ValueError(f"{name} is an empty list, which the {suite} suite needs values of: give at least "
                                 f"one, or leave {suite} out of the suites")
        if self.data not in (None, HELD_OUT):
            from t2r.data.documents import is_local, local_files

            for text in self.texts():
                if is_local(text):
                    local_files(text)  # raises naming the missing file or unsupported suffix

    def texts(self) -> list[str]:
        """The held-out texts of `data` (split at commas), or [] for generated documents."""
        if self.data is None:
            return []
        texts = [t.strip() for t in self.data.split(",")]
        if not all(texts) or len(set(texts)) != len(texts):
            raise ValueError(f"data={self.data!r}: give distinct texts joined by single commas (A,B)")
        return texts

    def harness_asked(self) -> bool:
        """Whether any lm-eval suite or task is asked for (without resolving them)."""
        return bool(self.tasks) or any(s not in BUILTIN_SUITES for s in self.suites)
