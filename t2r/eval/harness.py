"""lm-eval glue: named task suites, local multiple-choice JSONL tasks, and one call that scores a live model.

`resolve_tasks` turns a suite name and/or task entries into `TaskSpec`s, `check_tasks` validates them against
the installed lm-eval's task index (before any model is loaded), and `run_harness` wraps an already loaded
model in lm-eval's `HFLM` and runs `lm_eval.simple_evaluate`, one call per few-shot count.

lm-eval is an optional extra (`pip install -e .[eval]`); it is imported only inside functions.

Suites (task, few-shot, reported metric) follow the GSA paper (Zhang et al. 2024, arXiv 2409.07146) and the
linearization literature:

- `commonsense`: arc_easy acc, arc_challenge acc_norm, hellaswag acc_norm, piqa acc, winogrande acc; 0-shot.
- `knowledge`: nq_open and triviaqa exact_match, 5-shot.
- `aggregate`: mmlu acc 5-shot, bbh_fewshot exact_match 3-shot (direct answers; `bbh` / `bbh_cot_fewshot`
  are the chain-of-thought variant, up to 1024 generated tokens per question).
- `recall`: the recall-intensive tasks of Arora et al. (Based / JRT): fda, swde, squad_completion (`contains`),
  nq_open, triviaqa (exact_match), drop (f1); 0-shot. lm-eval ships fda/swde/squad_completion in the JRT
  format; nq_open, triviaqa and drop are lm-eval's standard generative versions, not the JRT cloze variants,
  so those three are not comparable to GSA Table 4. Recall needs long contexts: pass `max_length=4096`.
- `local`: every *.jsonl under `$T2R_EVAL_DATA` (a directory; `os.pathsep`-separated for several).

Local multiple-choice files hold one `{"query": str, "choices": [str], "gold": int}` per line; choices carry
their own leading space (the task's target delimiter is ""). `t2r.eval.multiple_choice` scores the same format
without lm-eval, as a reference.
"""

from __future__ import annotations

import difflib
import functools
import os
from dataclasses import dataclass
from pathlib import Path

LOCAL_DATA_ENV = "T2R_EVAL_DATA"

PRESETS: dict[str, list[tuple[str, int, str]]] = {
    "commonsense": [
        ("arc_easy", 0, "acc"),
        ("arc_challenge", 0, "acc_norm"),
        ("hellaswag", 0, "acc_norm"),
        ("piqa", 0, "acc"),
        ("winogrande", 0, "acc"),
    ],
    "knowledge": [
        ("nq_open", 5, "exact_match"),
        ("triviaqa", 5, "exact_match"),
    ],
    "aggregate": [
        ("mmlu", 5, "acc"),
        ("bbh_fewshot", 3, "exact_match"),
    ],
    "recall": [
        ("fda", 0, "contains"),
        ("swde", 0, "contains"),
        ("squad_completion", 0, "contains"),
        ("nq_open", 0, "exact_match"),
        ("triviaqa", 0, "exact_match"),
        ("drop", 0, "f1"),
    ],
    "local": [],  # filled at resolve time from $T2R_EVAL_DATA
}

LOCAL_METRIC = "acc"  # what a local multiple-choice task reports; acc_norm and acc_bytes are in "all"


@dataclass
class TaskSpec:
    """One task to run: lm-eval name (or local file stem), few-shot count (None: the task's default, 0 if it
    has none), the metric to report (None: the first one lm-eval returns), and, for local tasks, the config."""

    name: str
    num_fewshot: int | None = None
    metric: str | None = None
    config: dict | None = None

    @property
    def is_local(self) -> bool:
        return self.config is not None


def _require_lm_eval():
    try:
        import lm_eval
    except ImportError as err:
        raise ImportError("lm-eval is not installed: pip install -e .[eval]  (or pip install 'lm-eval[hf]')") from err
    return lm_eval


# ---------------------------------------------------------------------------------------------------------------
# local multiple-choice tasks


def _jsonl_files(path: str | os.PathLike) -> list[Path]:
    path = Path(path).expanduser()
    if path.is_dir():
        files = sorted(path.glob("*.jsonl"))
        if not files:
            raise ValueError(f"no *.jsonl files in {path}")
        return [p.resolve() for p in files]
    if path.is_file() and path.suffix == ".jsonl":
        return [path.resolve()]
    raise ValueError(f"not a .jsonl file or a directory: {path}")


def local_task_config(path: str | os.PathLike, name: str | None = None) -> dict:
    """lm-eval task config (a dict, as `simple_evaluate(tasks=[...])` accepts) for one local JSONL file."""
    path = Path(path).expanduser().resolve()
    return {
        "task": name or path.stem,
        "dataset_path": "json",
        # absolute: lm-eval hands data_files to datasets.load_dataset unchanged (relative = against the CWD)
        "dataset_kwargs": {"data_files": {"test": str(path)}},
        "test_split": "test",
        "output_type": "multiple_choice",
        "doc_to_text": "query",
        "doc_to_choice": "choices",
        "doc_to_target": "gold",
        "target_delimiter": "",  # the choices already start with a space
        "metric_list": [
            {"metric": m, "aggregation": "mean", "higher_is_better": True} for m in ("acc", "acc_norm", "acc_bytes")
        ],
        "metadata": {"version": 1.0, "source": str(path)},
    }


def local_task(path: str | os.PathLike) -> dict:
    """The lm-eval config of a local JSONL task (name = file stem); a directory gives {stem: config} of all
    its *.jsonl files. For a single file, the config itself is returned."""
    files = _jsonl_files(path)
    if Path(path).expanduser().is_dir():
        return {p.stem: local_task_config(p) for p in files}
    return local_task_config(files[0])


def local_specs(path: str | os.PathLike) -> list[TaskSpec]:
    """TaskSpecs (0-shot, metric acc) for a JSONL file or every *.jsonl in a directory."""
    return [TaskSpec(p.stem, 0, LOCAL_METRIC, local_task_config(p)) for p in _jsonl_files(path)]


def _is_local_entry(entry: str) -> bool:
    path = Path(entry).expanduser()
    return (path.is_file() and path.suffix == ".jsonl") or path.is_dir()


def _local_preset() -> list[TaskSpec]:
    value = os.environ.get(LOCAL_DATA_ENV)
    if not value:
        raise ValueError(f"suite 'local' reads the *.jsonl files of ${LOCAL_DATA_ENV} (a directory), which is not "
                         "set; set it, or pass the directory or files as tasks")
    specs = []
    for part in value.split(os.pathsep):
        if part:
            specs += local_specs(part)
    return specs


# ---------------------------------------------------------------------------------------------------------------
# resolving and checking names


def preset_specs(name: str) -> list[TaskSpec]:
    if name == "local":
        return _local_preset()
    return [TaskSpec(task, k, metric) for task, k, metric in PRESETS[name]]


@functools.lru_cache(maxsize=None)
def task_manager(include_defaults: bool = True):
    """lm-eval's TaskManager, built once per process (indexing the built-in tasks takes ~10 s)."""
    _require_lm_eval()
    from lm_eval.tasks import TaskManager

    return TaskManager(include_defaults=include_defaults)


@functools.lru_cache(maxsize=None)
def known_tasks() -> frozenset[str]:
    """Every task, group and tag name in the installed lm-eval's index."""
    return frozenset(task_manager().all_tasks)


def _unknown(name: str, candidates) -> ValueError:
    close = difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return ValueError(f"unknown task {name!r}: not a suite ({', '.join(PRESETS)}), an existing .jsonl file or "
                      f"directory, or a task of lm-eval's index{hint}")


def check_tasks(specs: list[TaskSpec]) -> list[TaskSpec]:
    """Raise ValueError (with close matches) for a non-local spec not in lm-eval's task index; returns specs.
    Needs no model: call it before loading one."""
    remote = [s for s in specs if not s.is_local]
    if remote:
        known = known_tasks()
        for spec in remote:
            if spec.name not in known:
                raise _unknown(spec.name, set(known) | set(PRESETS))
    for spec in specs:
        if spec.is_local:
            source = spec.config["dataset_kwargs"]["data_files"]["test"]
            if not Path(source).is_file():
                raise ValueError(f"local task {spec.name!r}: file not found: {source}")
    return specs


def resolve_tasks(suite: str | None = None, tasks: list[str] | None = None, *, num_fewshot: int | None = None,
                  check: bool = True) -> list[TaskSpec]:
    """TaskSpecs for a suite (a PRESETS name, or several joined by commas) and/or task entries.

    An entry is an existing .jsonl file or directory (local multiple-choice tasks), a suite name, or an lm-eval
    task/group name (run with `num_fewshot`, default: the task's own). Duplicates keep their first occurrence.
    With `check` (default) every name is validated against lm-eval's index (`check_tasks`): an unknown name
    raises ValueError with close matches.
    """
    entries = [s.strip() for s in (suite or "").split(",") if s.strip()]
    for entry in entries:
        if entry not in PRESETS:
            close = difflib.get_close_matches(entry, list(PRESETS), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"unknown suite {entry!r}: choose from {', '.join(PRESETS)}{hint}")
    specs: list[TaskSpec] = []
    for entry in entries:
        specs += preset_specs(entry)
    for entry in tasks or []:
        entry = str(entry).strip()
        if not entry:
            continue
        if _is_local_entry(entry):
            specs += local_specs(entry)
        elif entry in PRESETS:
            specs += preset_specs(entry)
        elif entry.endswith(".jsonl") or os.sep in entry:
            raise ValueError(f"local task file not found: {entry}")
        else:
            specs.append(TaskSpec(entry, num_fewshot, None))
    if not specs:
        raise ValueError("no tasks: give a suite or task names")
    seen, unique = set(), []
    for spec in specs:
        if spec.name not in seen:
            seen.add(spec.name)
            unique.append(spec)
    return check_tasks(unique) if check else unique


# ---------------------------------------------------------------------------------------------------------------
# running


def _number(value):
    if value is None or isinstance(value, str):  # lm-eval writes "N/A" for a stderr it did not compute
        return None
    return float(value)


def _pick(results: dict, metric: str | None) -> tuple[str | None, str | None]:
    """(result key, metric name) for `metric` ("acc" matches "acc,none" first, then "acc,<any filter>";
    "exact_match,remove_whitespace" matches exactly); None: the first metric lm-eval reported."""
    keys = [k for k in results if "," in k and "_stderr," not in k]
    if metric is None:
        return (keys[0], keys[0].split(",")[0]) if keys else (None, None)
    if "," in metric:
        return (metric, metric.split(",")[0]) if metric in results else (None, metric)
    if f"{metric},none" in results:
        return f"{metric},none", metric
    matches = [k for k in keys if k.split(",")[0] == metric]
    return (matches[0], metric) if matches else (None, metric)


def _samples(out: dict, name: str) -> int | None:
    """Documents evaluated for a task, or summed over a group's leaf tasks."""
    counts, subtasks = out.get("n-samples", {}), out.get("group_subtasks", {})
    if name in counts:
        return int(counts[name]["effective"])
    if subtasks.get(name):
        parts = [_samples(out, sub) for sub in subtasks[name]]
        return sum(p for p in parts if p is not None)
    return None


def _summary(out: dict, spec: TaskSpec) -> dict:
    results = out["results"].get(spec.name)
    if results is None:
        raise RuntimeError(f"lm-eval returned no results for {spec.name!r} (got: {', '.join(out['results'])})")
    key, metric = _pick(results, spec.metric)
    if key is None:
        raise RuntimeError(f"{spec.name}: lm-eval reported no {spec.metric!r} (got: {', '.join(results)})")
    stderr_key = key.replace(",", "_stderr,", 1)
    shots = out.get("n-shot", {}).get(spec.name, spec.num_fewshot)
    return {
        "metric": metric,
        "value": _number(results[key]),
        "stderr": _number(results.get(stderr_key)),
        "n": _samples(out, spec.name),
        "num_fewshot": shots,
        "all": {k: (_number(v) if not isinstance(v, str) or v == "N/A" else v)
                for k, v in results.items() if "," in k},
    }


def run_harness(model, tokenizer, specs: list[TaskSpec], *, limit: int | float | None = None, batch_size: int | str = 8,
                max_length: int = 2048, seed: int = 0, device: str | None = None, bootstrap_iters: int = 100,
                **hflm_kwargs) -> dict:
    """Score a loaded causal LM on `specs` with lm-eval; returns
    `{"lm_eval_version", "tasks": {name: {"metric", "value", "stderr", "n", "num_fewshot", "all"}}}`.

    The model is used as it is (dtype, device; `device` moves it first); `max_length` bounds every request
    (longer ones are left-truncated by lm-eval) and should be the same for a source and its conversion.
    `limit` caps documents per task (per subtask of a group); stderr is closed-form for means and a
    `bootstrap_iters`-draw bootstrap otherwise (0: none). Extra keyword arguments go to `HFLM` (e.g.
    `add_bos_token`, `softmax_dtype`, `mixed_precision_dtype`). Local tasks need no network.
    """
    lm_eval = _require_lm_eval()
    from lm_eval.models.huggingface import HFLM

    specs = list(specs)
    if not specs:
        raise ValueError("no tasks to run")
    if device is not None:
        model = model.to(device)
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, max_length=max_length,
              backend="causal", **hflm_kwargs)
    # local tasks alone need no index of lm-eval's ~10k built-in tasks
    manager = task_manager(include_defaults=not all(s.is_local for s in specs))

    by_shots: dict[int | None, list[TaskSpec]] = {}
    for spec in specs:
        by_shots.setdefault(spec.num_fewshot, []).append(spec)
    tasks = {}
    for shots, group in by_shots.items():
        out = lm_eval.simple_evaluate(
            model=lm,
            tasks=[s.config if s.is_local else s.name for s in group],
            num_fewshot=shots,
            limit=limit,
            task_manager=manager,
            bootstrap_iters=bootstrap_iters,
            log_samples=False,
            random_seed=seed,
            numpy_random_seed=seed,
            torch_random_seed=seed,
            fewshot_random_seed=seed,
        )
        for spec in group:
            tasks[spec.name] = _summary(out, spec)
    return {"lm_eval_version": lm_eval.__version__, "tasks": {s.name: tasks[s.name] for s in specs}}
