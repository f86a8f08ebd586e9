"""Finetuning recipes: shipped files load with their key numbers; overrides, errors, round trip, batch math."""

import importlib.machinery
import sys
import types
from pathlib import Path

import pytest
import yaml

from t2r.train.recipe import RecipeError, load_recipe, save_resolved
from tests.helpers.recipes import make_recipe as make

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def error(*overrides, check_files=True) -> str:
    with pytest.raises(RecipeError) as info:
        make(*overrides, check_files=check_files)
    return str(info.value)


@pytest.fixture
def wandb_installed(monkeypatch):
    """A recipe naming a tracker validates only where its package is installed: a stand-in for wandb."""
    module = types.ModuleType("wandb")
    module.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
    monkeypatch.setitem(sys.modules, "wandb", module)


def test_every_shipped_recipe_loads_and_is_listed():
    files = sorted(RECIPES.glob("*.yaml"))
    assert {f.stem for f in files} == {
        "mistral-7b-gsa-20b", "mistral-7b-gla-20b", "mistral-7b-retnet-20b", "mistral-7b-gsa-100b",
        "llama-3-8b-gsa-20b", "smollm2-gsa-cpu", "smollm2-gsa-h100", "smollm2-staged-cpu", "smollm2-staged-h100",
        "smollm2-best-h100"}
    table = (RECIPES / "README.md").read_text()
    for f in files:
        recipe = load_recipe(f, check_files=False)
        assert recipe.name == f.stem and recipe.checkpoint.dir == f"runs/{f.stem}"
        assert f"`{f.name}`" in table
        text = f.read_text()
        assert text.startswith("#") and f"t2r finetune --config recipes/{f.name}" in text
        assert "shared/" not in text


@pytest.mark.parametrize("stem, source, target, tokens", [
    ("mistral-7b-gsa-20b", "mistralai/Mistral-7B-v0.1", "gsa", 20_000_000_000),
    ("mistral-7b-gla-20b", "mistralai/Mistral-7B-v0.1", "gla", 20_000_000_000),
    ("mistral-7b-retnet-20b", "mistralai/Mistral-7B-v0.1", "retnet", 20_000_000_000),
    ("mistral-7b-gsa-100b", "mistralai/Mistral-7B-v0.1", "gsa", 100_000_000_000),
    ("llama-3-8b-gsa-20b", "meta-llama/Meta-Llama-3-8B", "gsa", 20_000_000_000),
])
def test_gsa_paper_settings(stem, source, target, tokens):
    r = load_recipe(RECIPES / f"{stem}.yaml", check_files=False)
    assert (r.model.source, r.model.dtype, r.convert.target) == (source, "bfloat16", target)
    assert r.convert.options == ({"num_slots": 64} if target == "gsa" else {})
    assert r.data.path == "cerebras/SlimPajama-627B" and r.data.streaming is True and r.data.seq_len == 2048
    t = r.train
    assert (t.lr, t.warmup_steps, t.schedule, t.tokens_per_step) == (3e-5, 1000, "cosine", 2_097_152)
    assert t.max_tokens == tokens and isinstance(t.max_tokens, int) and t.max_steps is None
    assert r.total_steps == tokens // 2_097_152 == {20: 9536, 100: 47683}[tokens // 10**9]
    assert (t.trainable, t.mixed_precision, t.gradient_checkpointing) == ("all", "bf16", True)
    assert r.lora is None and r.stages is None and [s.loss for s in r.stage_list] == [{"next_token": 1.0}]
    assert r.grad_accum_steps(8) == 1024 // (8 * t.micro_batch_size)


def test_smollm2_recipes():
    cpu = load_recipe(RECIPES / "smollm2-gsa-cpu.yaml", check_files=False)
    assert (cpu.model.source, cpu.data.path, cpu.data.seq_len) == ("smollm2", "data/train.jsonl", 256)
    assert (cpu.train.tokens_per_step, cpu.train.micro_batch_size, cpu.total_steps) == (1024, 4, 20)
    assert (cpu.train.lr, cpu.train.warmup_steps, cpu.train.mixed_precision) == (1e-3, 5, "no")
    assert cpu.grad_accum_steps(1) == 1
    missing = r"data.path: not found: no-such-dir/train.jsonl \(no such file or directory in "
    with pytest.raises(RecipeError, match=missing):
        load_recipe(RECIPES / "smollm2-gsa-cpu.yaml", ["data.path=no-such-dir/train.jsonl"])
    h100 = load_recipe(RECIPES / "smollm2-gsa-h100.yaml", check_files=False)
    assert (h100.data.seq_len, h100.train.tokens_per_step, h100.train.micro_batch_size) == (2048, 65536, 8)
    assert (h100.train.max_tokens, h100.total_steps, h100.grad_accum_steps(1)) == (100_000_000, 1525, 4)
    assert (h100.train.lr, h100.train.warmup_steps, h100.train.mixed_precision) == (3e-4, 100, "bf16")


def test_defaults_and_override_types(wandb_installed):
    r = make()
    assert (r.train.lr, r.train.betas, r.train.grad_clip, r.data.seq_len, r.checkpoint.dir) == \
        (3e-5, (0.9, 0.95), 1.0, 2048, "runs/t")
    r = make("train.lr=1e-4", "data.held_out=10", "train.betas=[0.9, 0.99]", "convert.options.num_slots=32",
             "convert.layers=0-11,15", "logging.trackers=wandb", "train.grad_clip=null", "train.max_steps=20e3",
             "stages.distill.weight=0.5", "data.streaming=true", "name=run1")
    assert r.train.lr == 1e-4 and isinstance(r.train.lr, float)  # PyYAML reads 1e-4 as a string
    assert r.data.held_out == 10 and r.train.betas == (0.9, 0.99)
    assert r.convert.options == {"num_slots": 32} and r.convert.layers == "0-11,15"
    assert r.logging.trackers == ["wandb"] and r.train.grad_clip is None
    assert r.train.max_steps == 20000 and isinstance(r.train.max_steps, int)
    assert [(s.name, s.loss, s.temperature) for s in r.stages] == [("distill", {"kl": 0.5, "next_token": 0.5}, 1.0)]
    assert r.data.streaming is True and r.checkpoint.dir == "runs/run1"
    assert make("train.lr=1").train.lr == 1.0 and isinstance(make("train.lr=1").train.lr, float)
    lora = make("lora.r=8", "train.trainable=lora", "lora.target_modules=[q_proj,v_proj]").lora
    assert (lora.r, lora.alpha, lora.target_modules) == (8, 32, ["q_proj", "v_proj"])
    assert make("convert.options.gate_logit_normalizer=4").convert.options == {"gate_logit_normalizer": 4.0}
    data = make("data.path=org/dataset").data
    assert data.data_config().path == "org/dataset" and not hasattr(data.data_config(), "seq_len")


@pytest.mark.parametrize("overrides, message", [
    (["train.lrr=1"], "train.lrr: unknown field; did you mean 'lr'?"),
    (["trian.lr=1"], "trian: unknown field; did you mean 'train'?"),
    (["convert.options.numslots=8"], "convert.options.numslots: unknown option; did you mean 'num_slots'?"),
    (["train.lr=fast"], "train.lr: expected a number, got 'fast'"),
    (["data.held_out=true"], "data.held_out: expected an integer, got True"),
    (["data.seq_len=2.5"], "data.seq_len: expected an integer, got 2.5"),
    (["train.gradient_checkpointing=1"], "train.gradient_checkpointing: expected true or false, got 1"),
    (["train.betas=[0.9]"], "train.betas: expected a list of 2 items"),
    (["train.betas=[0.9, 1.5]"], "train.betas: must be < 1, got 1.5"),
    (["convert.target=gsaa"],
     "convert.target: 'gsaa' is not one of gsa, gla, retnet, fox, gdn, none; did you mean 'gsa'?"),
    (["train.schedule=step"], "train.schedule: 'step' is not one of cosine, linear, constant"),
    (["model.dtype=fp8"], "model.dtype: 'fp8' is not one of float32, bfloat16, float16"),
    (["logging.trackers=[tensorboard, mlflow]"], "logging.trackers: 'mlflow' is not one of tensorboard, wandb"),
    (["model.source=null"], "model.source: must be set"),
    (["train.max_tokens=1000000"], "train.max_steps / train.max_tokens: set exactly one of them (got both)"),
    (["train.max_steps=null"], "train.max_steps / train.max_tokens: set exactly one of them (got neither)"),
    (["train.trainable=lora"], "lora: missing; train.trainable=lora needs a lora section"),
    (["lora.r=8"], "lora: set, but train.trainable is 'all'"),
    (["data.seq_len=0"], "data.seq_len: must be >= 2, got 0"),
    (["data.seq_len=1"], "data.seq_len: must be >= 2, got 1"),  # every label would be masked: nan loss
    (["model.dtype=float16", "train.mixed_precision='no'"], "model.dtype: float16 weights trained without mixed"),
    (["train.max_nonfinite_steps=0"], "train.max_nonfinite_steps: must be >= 1, got 0"),
    (["train.tokens_per_step=-4096"], "train.tokens_per_step: must be >= 1, got -4096"),
    (["train.tokens_per_step=3000"],
     "train.tokens_per_step: 3000 tokens is not a positive multiple of data.seq_len (2048)"),
    (["train.lr=0"], "train.lr: must be > 0"),
    (["convert.target=none", "convert.options.num_slots=8"], "convert.options: needs converted layers"),
    (["convert.target=none", "stages.distill.weight=1"], "stages[0] (distill).loss: kl compares against the"),
    (["convert.target=retnet", "train.trainable=gates"], "train.trainable: 'gates' trains the new gates"),
    (["stages.attention_transfer.steps=10"], "stages.attention_transfer: the mapping form of stages is read into"),
    (["stages.distill.weight=2"], "stages.distill.weight: expected a number in [0, 1], got 2"),
    (["stages.distil.weight=1"], "stages.distil: unknown section; did you mean 'distill'?"),
    (["convert.options.feature_map=tanh"], "convert.options: feature_map='tanh' is not one of"),
    (["convert.options.num_slots=many"], "convert.options.num_slots: expected an integer, got 'many'"),
    (["convert.layers=first"], "convert.layers: 'first' is not a layer list"),
    (["train.max_steps.x=1"], "train.max_steps: is a value, not a section"),
    (["train.lr"], "override 'train.lr': expected section.field=value"),
    (["data.path=./no/such/dir"], "data.path: not found: ./no/such/dir (no such file or directory in "),
    (["data.path=missing-corpus.jsonl"], "data.path: not found: missing-corpus.jsonl (no such file"),
    (["model.source=./missing.gguf"], "model.source: not found: ./missing.gguf (no such file"),
    (["model.source=runs/nope/final"], "model.source: not found: runs/nope/final (no such file or directory in "),
    (["data.path=corpus.csv"], "data.path: not found: corpus.csv (no such file"),
])
def test_errors_name_the_field(overrides, message):
    assert message in error(*overrides)


def test_missing_required_and_file_checks(tmp_path):
    with pytest.raises(RecipeError, match="train.tokens_per_step: missing required field"):
        load_recipe(None, ["name=t", "model.source=x", "convert.target=gsa", "data.path=a/b", "train.max_steps=1"])
    with pytest.raises(RecipeError, match="^data: missing required section"):
        load_recipe(None, ["name=t", "model.source=x", "convert.target=gsa", "train.tokens_per_step=1"])
    with pytest.raises(RecipeError, match="nope.yaml"):
        load_recipe(tmp_path / "nope.yaml")
    assert make("data.path=cerebras/SlimPajama-627B").data.path == "cerebras/SlimPajama-627B"  # hub ids: unchecked
    assert make("data.path=./no/such/dir", check_files=False).data.path == "./no/such/dir"
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "hi"}\n')
    assert make(f"data.path={corpus}").data.path == str(corpus)
    assert make(f"data.path={tmp_path}/*.jsonl").data.path.endswith("*.jsonl")
    assert f"not found: {tmp_path}/*.parquet (no files match the pattern;" in error(f"data.path={tmp_path}/*.parquet")
    (tmp_path / "corpus.csv").write_text("text\nhi\n")  # a local file of a format the loader does not read
    assert "data.path: unsupported data file" in error(f"data.path={tmp_path}/corpus.csv")


def test_round_trip_through_save_resolved(tmp_path, wandb_installed):
    r = make("train.lr=1e-4", "lora.r=8", "train.trainable=lora", "convert.options.num_slots=16",
             "stages.distill.temperature=2", "logging.trackers=[wandb]")
    path = save_resolved(r, tmp_path / "out")
    assert path == tmp_path / "out" / "recipe.yaml"
    saved = yaml.safe_load(path.read_text())
    assert saved["train"]["warmup_steps"] == 1000 and saved["lora"]["alpha"] == 32  # defaults filled in
    assert saved["train"]["betas"] == [0.9, 0.95] and saved["checkpoint"]["dir"] == "runs/t"
    again = load_recipe(path)
    assert again == r and again.to_dict() == r.to_dict()
    for f in sorted(RECIPES.glob("*.yaml")):
        shipped = load_recipe(f, check_files=False)
        assert load_recipe(save_resolved(shipped, tmp_path / f.stem), check_files=False) == shipped


@pytest.mark.parametrize("tracker, packages", [("tensorboard", ("tensorboard", "tensorboardX")), ("wandb", ("wandb",))])
def test_an_uninstalled_tracker_is_refused_at_validation(monkeypatch, tracker, packages):
    """accelerate only warns about a tracker it cannot import, then logs nothing: the recipe refuses it,
    naming the package, before anything loads; a recipe without trackers needs none."""
    for package in packages:
        monkeypatch.setitem(sys.modules, package, None)  # as if not installed
    for check_files in (True, False):
        assert (f"logging.trackers: {tracker} is not installed (pip install {tracker}); or remove it"
                in error(f"logging.trackers=[{tracker}]", check_files=check_files))
    for f in sorted(RECIPES.glob("*.yaml")):
        assert load_recipe(f, check_files=False).logging.trackers == []


def test_grad_accum_steps():
    r = make("train.tokens_per_step=2097152", "data.seq_len=2048", "train.micro_batch_size=4")
    assert [r.grad_accum_steps(n) for n in (1, 2, 8, 256)] == [256, 128, 32, 1]
    for n in (3, 512):  # not a divisor; more micro-batch tokens than the step holds
        with pytest.raises(RecipeError, match=rf"train.tokens_per_step: 2097152 tokens .* x {n} process"):
            r.grad_accum_steps(n)
    assert make("train.max_tokens=40960", "train.max_steps=null").total_steps == 10
    assert "train.max_tokens: 100 is less than one step" in error("train.max_tokens=100", "train.max_steps=null")


def test_bare_yes_no_words_are_the_choices_they_name(tmp_path):
    """YAML reads a bare `no` as false: a field whose choices hold the word takes it (command line and file)."""
    assert make("train.mixed_precision=no").train.mixed_precision == "no"
    assert "train.schedule: expected a string, got False" in error("train.schedule=no")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: {source: x}\nconvert: {target: gsa}\ndata: {path: a/b}\n"
                      "train: {tokens_per_step: 2048, max_steps: 1, mixed_precision: no}\n")
    assert load_recipe(recipe).train.mixed_precision == "no"


def test_an_option_of_another_target_names_the_fix():
    with pytest.raises(RecipeError, match=r"convert.options.num_slots: an option of gsa, not of gla; remove it, or "
                                          r"set convert.options=\{\} for its defaults"):
        make("convert.target=gla", "convert.options.num_slots=8")


@pytest.mark.parametrize("gpus", [2, 4, 8])
def test_accelerate_fsdp2_configs_parse(gpus):
    from accelerate.commands.config.config_args import ClusterConfig

    config = ClusterConfig.from_yaml_file(str(RECIPES / "accelerate" / f"fsdp2-{gpus}gpu.yaml"))
    assert (config.distributed_type.value, config.num_processes, config.mixed_precision) == ("FSDP", gpus, "bf16")
    assert config.fsdp_config["fsdp_version"] == 2


def test_a_window_gives_retnet_a_gain_to_train_as_its_gates():
    recipe = load_recipe(Path(__file__).parents[2] / "recipes/mistral-7b-retnet-20b.yaml",
                         ["train.trainable=gates", "convert.options={window: 64, sinks: 4}"])
    assert recipe.train.trainable == "gates" and recipe.convert.options["window"] == 64


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path):
    """Before, the last `lr:` won silently."""
    path = tmp_path / "twice.yaml"
    path.write_text("model: {source: smollm2}\nconvert: {target: gsa}\ndata: {path: org/dataset}\n"
                    "train:\n  tokens_per_step: 4096\n  lr: 3.0e-4\n  max_steps: 10\n  lr: 1.0e-2\n")
    with pytest.raises(RecipeError, match=r"twice.yaml'?: key 'lr' is given twice, on line 6 and line 8: keep one"):
        load_recipe(path)
    with pytest.raises(RecipeError, match=r"override 'stages=\[\{name: a, name: b\}\]': key 'name' is given twice"):
        make("stages=[{name: a, name: b}]")
    path.write_text(path.read_text().replace("  lr: 1.0e-2\n", "  min_lr_ratio: 0.2\n"))
    assert load_recipe(path).train.lr == 3e-4


def test_the_frontier_recipes_load():
    """The recipes of the GPU students (recipes/frontier) stay valid as the fields change."""
    files = sorted((RECIPES / "frontier").glob("*.yaml"))
    assert files
    for f in files:
        recipe = load_recipe(f, check_files=False)
        assert recipe.name == f.stem and f.read_text().startswith("#"), f


def test_a_train_budget_that_no_stage_uses_is_refused():
    """train.max_tokens on a recipe whose every stage has its own budget would change nothing: refused by name
    (a stage without a budget, or a resolved recipe where one stage took it, still loads)."""
    stages = ["stages=[{name: a, loss: next_token, tokens: 8192}, {name: b, loss: next_token, steps: 3}]"]
    with pytest.raises(RecipeError, match=r"train.max_tokens=16,384 applies to no stage.*a: 8,192 tokens, b: 3 steps"):
        make(*stages, "train.max_steps=null", "train.max_tokens=16384")
    inherited = ["stages=[{name: a, loss: next_token, tokens: 8192}, {name: b, loss: next_token}]"]
    recipe = make(*inherited, "train.max_steps=null", "train.max_tokens=16384")
    assert [s.tokens for s in recipe.stages] == [8192, 16384]
    resolved = ["stages=[{name: a, loss: next_token, tokens: 8192}, {name: b, loss: next_token, tokens: 16384}]"]
    assert make(*resolved, "train.max_steps=null", "train.max_tokens=16384").stages[1].tokens == 16384
