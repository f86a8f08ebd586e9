"""The source model scored once with the students' eval settings (recipes/repro/*.yaml share them), so each
student's `t2r run` can skip the baseline:
`python benchmarks/repro/eval_source.py RECIPE OUT [section.field=value ...]`."""

import sys

import torch

from t2r.eval import evaluate, load_pair, write_report
from t2r.eval.models import eval_dtype
from t2r.train import load_recipe

recipe = load_recipe(sys.argv[1], sys.argv[3:])
out = sys.argv[2]
settings = recipe.eval
device = "cuda" if torch.cuda.is_available() else "cpu"
settings.dtype = eval_dtype(settings.dtype, device)
model, tokenizer, *_ = load_pair(recipe.model.source, "none", settings.dtype, device)
results = evaluate(model, tokenizer, settings, out, model_spec=recipe.model.source,
                   command=f"python benchmarks/repro/eval_source.py {' '.join(sys.argv[1:])}")
print(write_report(results, out).read_text())
