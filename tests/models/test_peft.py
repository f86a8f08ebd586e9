"""LoRA through peft on converted models: adapters on the reused projections, the new gates trained in full."""

import torch
from peft import LoraConfig, PeftModel, get_peft_model

import t2r
from tests.helpers.models import small, tiny_source

GATES = {"gsa": ["slot_gate"], "gla": ["gate"], "retnet": [], "fox": ["forget_gate"], "gdn": ["gates", "conv"]}


def lora(model, target):
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                        modules_to_save=GATES[target] or None, init_lora_weights=False)
    return get_peft_model(model, config)


def test_lora_changes_the_converted_layers_and_trains_only_adapters_and_gates(target, tmp_path):
    base = t2r.convert(tiny_source("llama"), target, **small(target))
    ids = torch.randint(3, 97, (2, 12))
    with torch.no_grad():
        before = base(ids).logits
    model = lora(base, target)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n or any(g in n for g in GATES[target]) for n in trainable)
    with torch.no_grad():  # non-zero LoRA init: the mixers must go through the wrapped projections
        after = model(ids).logits
    assert not torch.allclose(before, after)
    model(ids, labels=ids).loss.backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if p.requires_grad)

    model.save_pretrained(tmp_path)
    fresh = t2r.convert(tiny_source("llama"), target, **small(target))
    reloaded = PeftModel.from_pretrained(fresh, tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, after)
