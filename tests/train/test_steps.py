

def test_train_compile_compiles_the_layers_and_trains_as_eager(tmp_path, source_dir, corpus, capsys):
    """train.compile: every decoder layer of the student (and of a teacher) compiled in place, parameter names
    unchanged; the losses of a few steps equal the eager run's up to rounding."""
    import json
    import re

    import torch

    from t2r.train import finetune
    from t2r.train.model_setup import build_model
    from tests.helpers.recipes import recipe

    model, _, teacher = build_model(recipe(tmp_path, source_dir, corpus, **{
        "train.compile": True, "stages.distill": "{weight: 1.0}"}))
    assert all(layer._compiled_call_impl is not None for layer in model.model.layers)
    assert all(layer._compiled_call_impl is not None for layer in teacher.model.layers)
    assert not any("_orig_mod" in name for name in model.state_dict())
    losses, said = {}, {}
    for compiled in (False, True):
        torch._dynamo.reset()
        finetune(recipe(tmp_path, source_dir, corpus, run=f"compile-{compiled}",
                        **{"train.compile": compiled, "train.max_steps": 2, "data.held_out": 0}))
        said[compiled] = capsys.readouterr().out
        rows = (tmp_path / f"compile-{compiled}" / "metrics.jsonl").read_text().splitlines()
        losses[compiled] = [json.loads(r)["loss"] for r in rows if '"loss"' in r]
    assert len(losses[True]) == 2
    rows = [json.loads(r) for r in (tmp_path / "compile-True" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["compiled_graphs"] > 0 for r in rows if "loss" in r)  # how many graphs the run has compiled
    assert "compiled_graphs" not in (tmp_path / "compile-False" / "metrics.jsonl").read_text()
    # after the start-up line, what the first step compiled and what torch.compile's caches gave it
    line = next(line for line in said[True].splitlines() if line.startswith("first step: compiled graphs by now "))
    assert re.search(r"now \d+ \(Inductor's cache \d+ hit, \d+ missed, \d+ bypassed", line), line
    assert "compiled graphs" not in said[False]
    startup = {c: json.loads((tmp_path / f"compile-{c}" / "startup.json").read_text()) for c in (False, True)}
    assert startup[True]["compile_s"] > 0 and "compile_s" not in startup[False]  # its own part of the start-up
    assert re.search(r"start-up: .*, compile \d+\.\d s,", said[True])
    for a, b in zip(losses[True], losses[False]):
        assert abs(a - b) < 1e-4 * abs(b)


def test_the_held_out_loss_of_a_compiled_model_runs_eager(tmp_path, source_dir, corpus):
    """A handful of evaluation-mode forwards (before training, after it) compile no graph of their own (they cost
    more to compile than to run), and measure what the compiled layers would."""
    import torch
    from torch._dynamo.utils import counters

    from t2r.train.batches import heldout_loss
    from t2r.train.model_setup import build_model
    from tests.helpers.recipes import recipe

    r = recipe(tmp_path, source_dir, corpus, **{"train.compile": True})
    model, tokenizer, _ = build_model(r)
    torch._dynamo.reset()
    counters.clear()
    compiled = heldout_loss(model, r, tokenizer, "cpu")
    assert not counters["stats"]["unique_graphs"] and compiled == compiled  # nothing compiled, a number
    with torch.compiler.set_stance("force_eager"):
        assert heldout_loss(model, r, tokenizer, "cpu") == compiled


def test_train_compile_with_a_window_off_cuda_is_refused_before_loading(tmp_path, source_dir, corpus):
    """Inductor's CPU code for the window's backward corrupts memory (the process dies with 'double free or
    corruption', torch 2.13): the run stops first, naming the setting, before the model loads."""
    import pytest

    from t2r.train.model_setup import build_model
    from tests.helpers.recipes import recipe

    for extra in ({"convert.options.window": 16, "convert.options.sinks": 2}, {"convert.kept_window": 16}):
        r = recipe(tmp_path, source_dir, corpus, **{"train.compile": True, **extra, **(
            {"convert.layers": "0", "convert.options.window": 4} if "convert.kept_window" in extra else {})})
        with pytest.raises(ValueError, match="train.compile=false"):
            build_model(r, device="cpu")
