"""Peak host memory of `t2r convert` against the size of the model it converts.

Saves a random Llama (default ~0.85B parameters, bf16 safetensors: 1.7 GB) and converts it three ways, each in
its own process under `/usr/bin/time -f %M` (peak resident set): a plain `from_pretrained` + `save_pretrained`
(the floor), the conversion copying the source's tensors (`t2r.convert(copy=True)`, what `t2r convert` did
before), and `t2r convert` itself (`copy=False`: the converted model takes the source's tensors). A process that
only imports torch, transformers and t2r gives the interpreter's own share, which does not grow with the model:
the last column is what each process holds above it, per byte of model (the measure of a 7B conversion).

    python benchmarks/convert_memory.py                  # ~2 minutes on 2 CPU cores
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

CONFIG = dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
              num_attention_heads=16, num_key_value_heads=4, tie_word_embeddings=False)
IMPORTS = "import torch, transformers, t2r, t2r.convert, t2r.sources"
RESAVE = ("from transformers import AutoModelForCausalLM; import sys; "
          "AutoModelForCausalLM.from_pretrained(sys.argv[1]).save_pretrained(sys.argv[2])")
SETUP = ("import sys; from accelerate import Accelerator; from t2r.train import load_recipe; "
         "from t2r.train.model_setup import build_model; r = load_recipe(sys.argv[1]); "
         "m, tok, teacher = build_model(r); Accelerator(cpu=True, mixed_precision='bf16').prepare(m)")
RECIPE = """name: memory
model: {{source: "{source}", dtype: bfloat16}}
convert: {{target: gsa}}
data: {{path: "{data}", seq_len: 64}}
train: {{tokens_per_step: 64, max_steps: 1, mixed_precision: bf16}}
checkpoint: {{dir: "{tmp}/run"}}
"""
COPY = ("import sys, t2r; from t2r.sources import load_source; s, tok = load_source(sys.argv[1]); "
        "m = t2r.convert(s, 'gsa', copy=True); m.save_pretrained(sys.argv[2])")


def word_level_tokenizer(size: int):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(size)}, unk_token="w3"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="w0", bos_token="w1", eos_token="w2")


ANON = """import threading, time
_peak = [0]
def _sample():
    while True:
        with open("/proc/self/status") as f:
            _peak[0] = max([_peak[0]] + [int(l.split()[1]) for l in f if l.startswith("RssAnon:")])
        time.sleep(0.005)
threading.Thread(target=_sample, daemon=True).start()
"""


def peak_kib(command: list[str]) -> tuple[int, int]:
    """(peak resident KiB, peak anonymous KiB) of `python -c CODE args`: anonymous memory leaves out the
    file-backed pages of the mapped safetensors, which the kernel can drop under pressure."""
    code = ANON + command[2] + "\nprint('RssAnon', _peak[0])"
    done = subprocess.run(["/usr/bin/time", "-f", "%M", command[0], "-c", code, *command[3:]], capture_output=True,
                          text=True, check=True)
    anon = next(int(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("RssAnon"))
    return int(done.stderr.strip().splitlines()[-1]), anon


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=CONFIG["num_hidden_layers"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "source"
        model = LlamaForCausalLM(LlamaConfig(**{**CONFIG, "num_hidden_layers": args.layers})).to(torch.bfloat16)
        params = sum(p.numel() for p in model.parameters())
        model.save_pretrained(source)
        word_level_tokenizer(CONFIG["vocab_size"]).save_pretrained(source)  # loading a source needs one
        del model
        model_bytes = sum(f.stat().st_size for f in source.glob("*.safetensors"))
        data = Path(tmp) / "data.jsonl"
        data.write_text("".join('{"text": "' + " ".join(f"w{i % 300}" for i in range(j, j + 200)) + '"}\n'
                                for j in range(40)))
        recipe = Path(tmp) / "recipe.yaml"
        recipe.write_text(RECIPE.format(source=source, data=data, tmp=tmp))
        rows = [
            ("from_pretrained + save_pretrained (no conversion)",
             peak_kib([sys.executable, "-c", RESAVE, str(source), f"{tmp}/resaved"])),
            ("t2r.convert(copy=True) + save_pretrained (before)",
             peak_kib([sys.executable, "-c", COPY, str(source), f"{tmp}/copied"])),
            ("t2r finetune set-up (build_model + prepare; fp32 master weights = 2x the bf16 file)",
             peak_kib([sys.executable, "-c", SETUP, str(recipe)])),
            ("t2r convert --to gsa (copy=False)",
             peak_kib([sys.executable, "-c", "import sys; from t2r.cli import main; main(sys.argv[1:])", "convert",
                       "--model", str(source), "--to", "gsa", "--out", f"{tmp}/converted", "--device", "cpu"])),
        ]
    base, base_anon = (k * 1024 for k in peak_kib([sys.executable, "-c", IMPORTS]))
    print(f"Random Llama, {params / 1e9:.2f}B parameters, bf16 safetensors {model_bytes / 1e9:.2f} GB; the imports "
          f"alone: {base / 1e9:.2f} GB resident, {base_anon / 1e9:.2f} GB anonymous:\n")
    print("| process | peak RSS GB | x model bytes | above the imports, x model bytes | peak anonymous GB | "
          "anonymous above the imports, x model bytes |\n|---|---|---|---|---|---|")
    for name, (kib, anon) in rows:
        print(f"| {name} | {kib * 1024 / 1e9:.2f} | {kib * 1024 / model_bytes:.2f} | "
              f"{(kib * 1024 - base) / model_bytes:.2f} | {anon * 1024 / 1e9:.2f} | "
              f"{(anon * 1024 - base_anon) / model_bytes:.2f} |")
    print("\nCommand: python " + " ".join(sys.argv))


if __name__ == "__main__":
    main()
