"""A LoRA run's final/ is a complete model (adapters merged, exactly as peft's merge_and_unload would), which
`t2r generate` loads; an adapter directory loads too when it names its base, and fails with a message when
it does not; a target list naming a module the model lacks is refused."""

import copy
import json

import pytest
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file

import t2r
from t2r.cli import main
from t2r.sources import load_source
from t2r.train import RecipeError, finetune
from t2r.train.export import merged_lora_state_dict
from t2r.train.model_setup import check_lora_targets
from tests.helpers.data import char_tokenizer
from tests.helpers.models import tiny_source
from tests.helpers.recipes import recipe


def lora_model(seed=0):
    model = t2r.convert(tiny_source("llama"), "gsa", num_slots=8)
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                            modules_to_save=["slot_gate"]))
    torch.manual_seed(seed)
    with torch.no_grad():  # trained-looking adapters (lora_B starts at zero) and gates
        for p in peft.parameters():
            if p.requires_grad:
                p.add_(0.1 * torch.randn_like(p))
    return peft


def test_merged_state_dict_equals_peft_merge_and_unload():
    peft = lora_model()
    merged = merged_lora_state_dict(peft, peft.state_dict())
    reference = copy.deepcopy(peft).merge_and_unload().state_dict()
    assert merged.keys() == reference.keys()
    for name, value in reference.items():
        torch.testing.assert_close(merged[name], value, rtol=0, atol=0, msg=name)
    base = peft.get_base_model().state_dict()
    assert not torch.equal(merged["model.layers.0.self_attn.q_proj.weight"],
                           base["model.layers.0.self_attn.q_proj.base_layer.weight"])


def test_lora_run_final_is_a_loadable_model(tmp_path, source_dir, corpus, capsys):
    r = recipe(tmp_path, source_dir, corpus, **{"train.trainable": "lora", "lora.r": 4, "train.max_steps": 2})
    finetune(r)
    final = tmp_path / "run" / "final"
    assert not (final / "adapter_config.json").exists()
    model, _ = load_source(str(final))
    weights = load_file(final / "model.safetensors")
    assert not any("lora" in k or "base_layer" in k for k in weights)
    source = load_file(source_dir / "model.safetensors")  # q_proj moved by the merged adapter, the MLP did not
    assert not torch.equal(weights["model.layers.0.self_attn.q_proj.weight"],
                           source["model.layers.0.self_attn.q_proj.weight"])
    assert torch.equal(weights["model.layers.0.mlp.up_proj.weight"], source["model.layers.0.mlp.up_proj.weight"])
    capsys.readouterr()
    assert main(["generate", "--model", str(final), "--prompt", "the quick", "--max-new-tokens", "3",
                 "--device", "cpu"]) == 0
    assert capsys.readouterr().out.startswith("the quick")


def test_an_adapter_directory_loads_with_its_base_or_fails_clearly(tmp_path):
    base = t2r.convert(tiny_source("llama"), "gsa", num_slots=8)
    base.save_pretrained(tmp_path / "base")
    peft = lora_model()
    peft.save_pretrained(tmp_path / "adapter")
    config_path = tmp_path / "adapter" / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = str(tmp_path / "base")
    config_path.write_text(json.dumps(config))
    char_tokenizer().save_pretrained(tmp_path / "base")
    model, _ = load_source(str(tmp_path / "adapter"))
    expected = copy.deepcopy(peft).merge_and_unload().state_dict()
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, expected[name], msg=name)
    config["base_model_name_or_path"] = None  # what older t2r LoRA runs wrote
    config_path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="holds only a LoRA adapter and names no base model"):
        load_source(str(tmp_path / "adapter"))


def test_lora_targets_must_all_exist():
    model = t2r.convert(tiny_source("llama"), "gsa", num_slots=8)
    check_lora_targets(model, ["q_proj", "o_proj", "slot_gate"])
    with pytest.raises(RecipeError, match="lora.target_modules: 'q_prj' matches no module of the model; "
                                          "did you mean 'q_proj'"):
        check_lora_targets(model, ["v_proj", "q_prj"])
