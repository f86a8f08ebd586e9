"""The model card t2r writes into model directories: what the config records, how the model was made, what each
target's fresh layers compute (from the mixer registry), and an evaluation read from results.json, in the form the
Hugging Face hub displays (front matter with a model-index), replaced, not stacked."""

import json
import re

import pytest
import yaml

from t2r.eval import frontier, report
from t2r.models import model_card
from t2r.models.model_card import card_text, write_model_card

CONFIG = {"model_type": "t2r_llama", "t2r_source": "smollm2", "t2r_mixers": ["softmax", "gsa", "gsa"],
          "t2r_options": {"gsa": {"num_slots": 64, "window": 0}}}


def front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card[4:card.index("\n---\n", 3) + 1])


def test_a_fresh_conversion_card_names_source_layers_options_and_command():
    card = card_text(CONFIG, "out/smollm2-gsa", "t2r convert --model smollm2 --to gsa --out out/smollm2-gsa")
    assert card.startswith("---\nlibrary_name: transformers\nbase_model: HuggingFaceTB/SmolLM2-135M-Instruct\n")
    assert front_matter(card)["tags"] == ["t2r", "linear-attention", "gsa"] and "# smollm2-gsa\n" in card
    assert "| layers | t2r_llama, 3 layers: 1 softmax, 2 gsa |" in card
    assert "| target options | gsa: num_slots=64, window=0 |" in card
    assert "| made by | `t2r convert --model smollm2 --to gsa --out out/smollm2-gsa` |" in card
    assert "none: freshly converted" in card and 'from_pretrained("out/smollm2-gsa")' in card
    assert "gsa (gated slot attention" in card and "something other than the source's softmax attention" in card


def test_a_finetuned_card_names_the_run_and_its_training():
    training = {"recipe": "smollm2-gsa-cpu", "stages": ["train"], "steps": 20, "tokens": 20480,
                "data": "data/train.jsonl", "held_out_loss": 1.6612}
    card = card_text({**CONFIG, "t2r_source": "./local/model"}, "runs/smollm2-gsa-cpu/final", "t2r run", training)
    assert "base_model" not in card and "# smollm2-gsa-cpu\n" in card  # a local source; final/ named by its run
    assert "| trained | 20 steps, 20,480 tokens of `data/train.jsonl` |" in card and "| held-out loss | 1.661 |" in card
    assert "datasets" not in front_matter(card)  # a local file is no hub dataset
    hub = card_text(CONFIG, "runs/x/final", "t2r run", {**training, "data": "HuggingFaceFW/fineweb-edu"})
    assert front_matter(hub)["datasets"] == ["HuggingFaceFW/fineweb-edu"]


def test_what_a_fresh_conversion_does_comes_from_the_registry_per_target():
    """Before, every fresh card said its new layers compute something else than softmax attention until finetuned,
    a FoX conversion's too, though its open forget gates make it generate what the source does."""
    fox = {**CONFIG, "t2r_mixers": ["fox"] * 3, "t2r_options": {"fox": {"rope": True, "fox_gate_bias": 8.0}}}
    card = card_text(fox, "out/fox", "t2r convert --to fox")
    assert "fox (forgetting attention" in card and "starts as the source: its forget gates start open" in card
    assert "something other than" not in card and "until finetuned" not in card
    no_rope = card_text({**fox, "t2r_options": {"fox": {"rope": False}}}, "out/fox", "t2r convert --to fox")
    assert "starts as the source" not in no_rope and "something other than the source's" in no_rope
    teacher = card_text(fox, "out/fox", "t2r convert --to fox --init teacher")
    assert "starts as the source" not in teacher and "look-back (`--init teacher`)" in teacher
    hybrid = card_text({**fox, "t2r_mixers": ["fox", "gsa"], "t2r_options": {"fox": {}, "gsa": {}}}, "o", "t2r")
    assert "fox (forgetting attention" in hybrid and "starts as the source" in hybrid  # each target its own
    assert "gsa (gated slot attention" in hybrid and "something other than the source's" in hybrid


def evaluation(model_ppl: float = 15.0) -> dict:
    """A results.json as `t2r eval` writes it: perplexity (windows 32, 128, 512 + 4 sinks of the source), MQAR and
    passkey, with the frontier computed as `t2r.eval.suite.evaluate` does."""
    def contender(name, role, window=None, state=0, per_token=1024, windowed=False):
        return {"name": name, "role": role, "window": window, "sinks": 4 if window else 0, "state_bytes": state,
                "bytes_per_token": per_token, "windowed": windowed}

    windows = {32: (30.0, 0.1), 128: (20.0, 0.3), 512: (14.0, 0.6)}
    names = ["gsa", "source", *[f"window {w}+4" for w in windows]]
    ppl = {"gsa": model_ppl, "source": 10.0, **{f"window {w}+4": v[0] for w, v in windows.items()}}
    rows = [{"name": n, "role": "model" if n == "gsa" else "baseline" if n == "source" else "window",
             "ppl": ppl[n] * 0.9137, "buckets": [{"start": 0, "end": 1024, "ppl": 3.14159},
                                                 {"start": 1024, "end": 2048, "ppl": ppl[n]}]} for n in names]
    info = {"spec": "x", "model_type": "t2r_llama", "parameters": 1000, "state_bytes": 0, "cache_bytes_per_token": 0}
    results = {
        "command": "t2r eval --model runs/r/final --out runs/r/eval", "settings": {"dtype": "float32", "seed": 0},
        "environment": {"device": "cpu", "torch": "2", "transformers": "5", "t2r": "0"},
        "names": {"model": "gsa", "baseline": "source"}, "models": {"model": info, "baseline": info},
        "contenders": [contender("gsa", "model", state=260 * 1024, per_token=0),
                       contender("source", "baseline", windowed=True),
                       *[contender(f"window {w}+4", "window", w) for w in windows]],
        "perplexity": {"data": "data/held_out.jsonl", "label": "held-out", "length": 2048, "rows": 4, "pack": True,
                       "results": rows},
        "mqar": {"count": 8, "pairs": [16, 64], "tokens": [512, 2048],
                 "accuracy": {"gsa": [0.625, 0.5], "source": [1.0, 0.875],
                              **{f"window {w}+4": [v[1], v[1] / 2] for w, v in windows.items()}}},
        "passkey": {"count": 4, "lengths": [1024, 2048], "depths": [0.0, 0.5, 1.0],
                    "accuracy": {n: [[0.25, 0.5, 0.75], [0.0, 0.25, 1.0]] for n in names}},
        "seconds": {"ppl": 3.0},
    }
    results["frontier"] = frontier.frontiers(results)
    return results


def evaluated(tmp_path, results: dict):
    """A run's final/ (its card) and eval/ (report.md, results.json, frontier.png) as `t2r run` leaves them."""
    final, out = tmp_path / "run" / "final", tmp_path / "run" / "eval"
    final.mkdir(parents=True, exist_ok=True)
    (final / "config.json").write_text(json.dumps(CONFIG))
    write_model_card(final, "t2r run --config r.yaml", {"recipe": "r", "stages": ["train"], "steps": 2,
                                                         "tokens": 64, "data": "data/train.jsonl",
                                                         "held_out_loss": 1.5})
    report.write(results, out, with_plots=False)
    (out / "frontier.png").write_bytes(b"png")  # as report.write draws it with matplotlib
    written = json.loads((out / "results.json").read_text())
    (out / "results.json").write_text(json.dumps({**written, "plots": ["frontier.png"]}, indent=1))
    return final, out


def add_evaluation(directory, results):
    """As the command line calls it: the report's summary lines and the frontier's verdicts word results.json."""
    return model_card.add_evaluation(directory, results, report.summary_lines, frontier.summary_lines)


def section(card: str) -> str:
    return card.split("\n## Evaluation\n")[1]


def test_every_number_of_the_evaluation_on_the_card_is_read_from_results_json(tmp_path):
    final, out = evaluated(tmp_path, evaluation())
    assert add_evaluation(final, out) == final / "README.md"
    card = (final / "README.md").read_text()
    results = json.loads((out / "results.json").read_text())
    meta = front_matter(card)
    assert meta["library_name"] == "transformers" and meta["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert "t2r" in meta["tags"] and "# run\n" in card and "| held-out loss | 1.500 |" in card  # the card stays
    [index] = meta["model-index"]
    assert index["name"] == "run"
    by_task = {r["task"]["name"]: r for r in index["results"]}
    ppl, mqar, passkey = (by_task[k]["metrics"] for k in (
        "Language modeling", "Multi-query associative recall (synthetic)", "Passkey retrieval (synthetic)"))
    model = next(r for r in results["perplexity"]["results"] if r["name"] == "gsa")
    assert [m["value"] for m in ppl] == [model["ppl"], *[b["ppl"] for b in model["buckets"]]]
    assert all(m["type"] == "perplexity" for m in ppl) and ppl[0]["value"] == 15.0 * 0.9137  # unrounded
    assert by_task["Language modeling"]["dataset"]["name"] == "held-out (`data/held_out.jsonl`)"
    assert [m["value"] for m in mqar] == results["mqar"]["accuracy"]["gsa"]
    assert [m["value"] for m in passkey] == [a for row in results["passkey"]["accuracy"]["gsa"] for a in row]
    assert mqar[1]["name"] == "MQAR accuracy, 64 pairs (2048 tokens)"
    assert passkey[4]["name"] == "passkey accuracy, 2048 tokens, needle depth 0.5"

    text = section(card)  # the report's summary lines and the frontier verdicts, as report.md words them
    lines = report.summary_lines(results)
    verdicts = frontier.summary_lines(results)
    assert len(verdicts) == 5 and all(v in text for v in verdicts)  # ppl 1K-2K, MQAR 16, 64, passkey 1K, 2K
    assert all(line in text for line in lines) and text.index("### Window frontier") < text.index(verdicts[0])
    assert "below the frontier by" in text and "(better)" in text
    assert "[report](../eval/report.md)" in text and "[results.json](../eval/results.json)" in text
    assert "![window frontier](../eval/frontier.png)" in text
    numbers = re.compile(r"\d+(?:\.\d+)?")
    in_report = set(numbers.findall((out / "report.md").read_text()))
    assert set(numbers.findall(text.split("Command:")[1])) <= in_report  # nothing the report does not say


def test_the_hub_reads_the_cards_model_index(tmp_path):
    from huggingface_hub import ModelCard

    final, out = evaluated(tmp_path, evaluation())
    add_evaluation(final, out / "results.json")
    card = ModelCard((final / "README.md").read_text())
    values = [(r.metric_type, r.metric_value) for r in card.data.eval_results]
    assert values[0] == ("perplexity", 15.0 * 0.9137) and len(values) == 3 + 2 + 6
    assert card.data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct" and card.data.library_name == "transformers"


def test_the_evaluation_is_replaced_not_stacked(tmp_path):
    final, out = evaluated(tmp_path, evaluation(model_ppl=25.0))
    add_evaluation(final, out)
    final, out = evaluated(tmp_path, evaluation(model_ppl=15.0))
    add_evaluation(final, out)
    card = (final / "README.md").read_text()
    assert card.count("## Evaluation") == 1 and card.count("model-index") == 1 and card.count("### Window") == 1
    assert "25.00" not in card and "15.00" in card
    assert [m["value"] for m in front_matter(card)["model-index"][0]["results"][0]["metrics"]][-1] == 15.0
    assert add_evaluation(tmp_path / "missing", out) is None


@pytest.mark.parametrize("text", ["# my own notes\n", "---\ntags: [bert]\n---\n# someone else's card\n"])
def test_a_card_that_is_not_t2rs_is_left_alone(tmp_path, text):
    final, out = evaluated(tmp_path, evaluation())
    (final / "README.md").write_text(text)
    assert add_evaluation(final, out) is None and (final / "README.md").read_text() == text


def test_without_a_baseline_or_a_plot_the_card_says_so(tmp_path):
    results = evaluation()
    final, out = evaluated(tmp_path, results)
    written = json.loads((out / "results.json").read_text())
    written.update(names={"model": "gsa", "baseline": None}, frontier=[], plots=[], quick=["ppl_rows 4 -> 1"])
    (out / "results.json").write_text(json.dumps(written))
    add_evaluation(final, out)
    text = section((final / "README.md").read_text())
    assert "against no baseline" in text and "No comparison with a source" in text and "frontier.png" not in text
    assert "**Quick look** (cut to: ppl_rows 4 -> 1)" in text
