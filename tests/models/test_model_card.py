"""The model card t2r writes into model directories: what the config records, how the model was made, and the
evaluation section replaced, not stacked."""

import json

from t2r.models.model_card import add_evaluation, card_text, write_model_card

CONFIG = {"model_type": "t2r_llama", "t2r_source": "smollm2", "t2r_mixers": ["softmax", "gsa", "gsa"],
          "t2r_options": {"gsa": {"num_slots": 64, "window": 0}}}


def test_a_fresh_conversion_card_names_source_layers_options_and_command():
    card = card_text(CONFIG, "out/smollm2-gsa", "t2r convert --model smollm2 --to gsa --out out/smollm2-gsa")
    assert card.startswith("---\nlibrary_name: transformers\nbase_model: HuggingFaceTB/SmolLM2-135M-Instruct\n")
    assert "  - gsa\n" in card and "# smollm2-gsa\n" in card
    assert "| layers | t2r_llama, 3 layers: 1 softmax, 2 gsa |" in card
    assert "| target options | gsa: num_slots=64, window=0 |" in card
    assert "| made by | `t2r convert --model smollm2 --to gsa --out out/smollm2-gsa` |" in card
    assert "none: freshly converted" in card and 'from_pretrained("out/smollm2-gsa")' in card


def test_a_finetuned_card_names_the_run_and_its_training():
    training = {"recipe": "smollm2-gsa-cpu", "stages": ["train"], "steps": 20, "tokens": 20480,
                "data": "data/train.jsonl", "held_out_loss": 1.6612}
    card = card_text({**CONFIG, "t2r_source": "./local/model"}, "runs/smollm2-gsa-cpu/final", "t2r run", training)
    assert "base_model" not in card and "# smollm2-gsa-cpu\n" in card  # a local source; final/ named by its run
    assert "| trained | 20 steps, 20,480 tokens of `data/train.jsonl` |" in card and "| held-out loss | 1.661 |" in card


def test_the_evaluation_section_is_replaced(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    write_model_card(tmp_path, "t2r convert", location="out/m")
    add_evaluation(tmp_path, ["- perplexity: 9.00 vs 3.00"], "runs/x/eval/report.md")
    add_evaluation(tmp_path, ["- perplexity: 5.37 vs 3.06"], "runs/x/eval/report.md")
    card = (tmp_path / "README.md").read_text()
    assert card.count("## Evaluation") == 1 and card.endswith("- perplexity: 5.37 vs 3.06\n") and "9.00" not in card
    assert add_evaluation(tmp_path / "missing", [], "r") is None
