import sys, glob
from pathlib import Path
from safetensors.torch import load_file
from t2r.train.recipe import load_recipe
from t2r.train.model_setup import build_model
run = Path(sys.argv[1])
step = sorted(glob.glob(str(run / "step-*")))[-1]
print("exporting", step)
recipe = load_recipe(str(run / "recipe.yaml"))
model, tokenizer, _ = build_model(recipe)
state = load_file(f"{step}/model.safetensors")
missing, unexpected = model.load_state_dict(state, strict=False)
print("missing", missing[:5], "unexpected", unexpected[:5])
out = run / "final"
model.save_pretrained(out); tokenizer.save_pretrained(out)
print("saved", out)
