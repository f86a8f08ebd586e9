"""Peak host memory of `t2r convert` against the size of the model it converts.

Saves a random Llama (default ~0.85B parameters, bf16 safetensors: 1.7 GB) and converts it three ways, each in
its own process under `/usr/bin/time -f %M` (peak resident set): a plain `from_pretrained` + `save_pretrained`
(the floor), the conversion copying the source's tensors (`t2r.convert(copy=True)`, what `t2r convert` did
before), and `t2r convert` itself (`copy=False`: the converted model takes the source's tensors).

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
RESAVE = ("from transformers import AutoModelForCausalLM; import sys; "
          "AutoModelForCausalLM.from_pretrained(sys.argv[1]).save_pretrained(sys.argv[2])")
COPY = ("import sys, t2r; from t2r.sources import load_source; s, tok = load_source(sys.argv[1]); "
        "m = t2r.convert(s, 'gsa', copy=True); m.save_pretrained(sys.argv[2])")


def word_level_tokenizer(size: int):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(size)}, unk_token="w3"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="w0", bos_token="w1", eos_token="w2")


def peak_kib(command: list[str]) -> int:
    done = subprocess.run(["/usr/bin/time", "-f", "%M", *command], capture_output=True, text=True, check=True)
    return int(done.stderr.strip().splitlines()[-1])


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
        rows = [
            ("from_pretrained + save_pretrained (no conversion)",
             peak_kib([sys.executable, "-c", RESAVE, str(source), f"{tmp}/resaved"])),
            ("t2r.convert(copy=True) + save_pretrained (before)",
             peak_kib([sys.executable, "-c", COPY, str(source), f"{tmp}/copied"])),
            ("t2r convert --to gsa (copy=False)",
             peak_kib([sys.executable, "-m", "t2r.cli", "convert", "--model", str(source), "--to", "gsa",
                       "--out", f"{tmp}/converted", "--device", "cpu"])),
        ]
    print(f"Random Llama, {params / 1e9:.2f}B parameters, bf16 safetensors {model_bytes / 1e9:.2f} GB; peak RSS:\n")
    print("| process | peak RSS GB | x model bytes |\n|---|---|---|")
    for name, kib in rows:
        print(f"| {name} | {kib * 1024 / 1e9:.2f} | {kib * 1024 / model_bytes:.2f} |")
    print("\nCommand: python " + " ".join(sys.argv))


if __name__ == "__main__":
    main()
