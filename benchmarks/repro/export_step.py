"""Write a run's newest checkpoint out as a model directory (`<run>/final`), for a run cut short before its
end (a device session that ran out): the model is rebuilt from the run's resolved recipe (same conversion and
layer ranking, read back from `<run>/layer_ranking`) and given the checkpoint's weights, every tensor checked.

    python benchmarks/repro/export_step.py runs/smollm2-gdn-hybrid [--step step-00000180-distill]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from safetensors.torch import load_file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--step", default=None, help="checkpoint directory name (default: the newest)")
    args = parser.parse_args()
    from t2r.train.model_setup import build_model
    from t2r.train.recipe import load_recipe

    step = args.run / args.step if args.step else sorted(args.run.glob("step-*"))[-1]
    out = args.run / "final"
    if out.exists():
        raise SystemExit(f"{out} exists: a finished run's model is never replaced")
    recipe = load_recipe(args.run / "recipe.yaml")
    model, tokenizer, _ = build_model(recipe)
    missing, unexpected = model.load_state_dict(load_file(step / "model.safetensors"), strict=False)
    tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise SystemExit(f"{step}: missing {sorted(set(missing) - tied)}, unexpected {sorted(unexpected)}")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    print(f"{step} -> {out}")


if __name__ == "__main__":
    main()
