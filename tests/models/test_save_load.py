"""converted -> save_pretrained -> AutoModelForCausalLM.from_pretrained gives identical logits."""

import os
import subprocess
import sys

import torch
from transformers import AutoModelForCausalLM

import t2r
from tests.helpers.models import small, tiny_source


def test_save_load_round_trip(tmp_path, arch, target):
    model = t2r.convert(tiny_source(arch), target, **small(target), layers=[0, 2])
    with torch.no_grad():  # move the gates off their initial values so loading them is really checked
        for name, p in model.named_parameters():
            if "gate" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is type(model)
    assert loaded.config.t2r_mixers == model.config.t2r_mixers
    assert loaded.config.t2r_options == model.config.t2r_options
    ids = torch.randint(3, 97, (2, 11))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_fresh_process_loads_after_import_t2r(tmp_path):
    model = t2r.convert(tiny_source("llama"), "gsa", num_slots=8)
    model.save_pretrained(tmp_path)
    ids = torch.arange(3, 12)[None]
    with torch.no_grad():
        expected = model(ids).logits[0, -1, :5].tolist()
    script = (
        "import torch, t2r\n"
        "from transformers import AutoModelForCausalLM\n"
        f"m = AutoModelForCausalLM.from_pretrained({str(tmp_path)!r})\n"
        "print(m(torch.arange(3, 12)[None]).logits[0, -1, :5].tolist())\n"
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    got = [float(x) for x in out.stdout.strip().strip("[]").split(",")]
    assert max(abs(a - b) for a, b in zip(got, expected)) < 1e-6


def test_bf16_model_converts_and_round_trips(tmp_path):
    source = tiny_source("llama").to(torch.bfloat16)
    model = t2r.convert(source, "gla")
    assert next(model.parameters()).dtype == torch.bfloat16
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    ids = torch.randint(3, 97, (1, 9))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
