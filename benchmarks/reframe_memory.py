"""A kept evaluation's window-frontier verdicts at the generation memory today's code holds for the same student.

The scores stay what `t2r eval` measured (`<run>/eval-*/results.json`); only the model's fixed cache bytes are
recomputed (`t2r.models.generation_cache.generation_memory` of the run's conversion: its `recipe.yaml`, and
`layer_ranking/ranking.json` for `layers: auto:N`), and `t2r.eval.frontier` places it on the measured window
curve again. For students evaluated before a change to what the cache keeps (the window ring, 2026-11-27):

    python benchmarks/reframe_memory.py benchmarks/results/long_and_constant_H100_2026-11-27/constant
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml


def state_bytes_today(run: Path) -> int:
    """Fixed generation-cache bytes of one sequence (bf16) of the run's converted model, by today's code."""
    from t2r.convert import auto_softmax_count, t2r_config
    from t2r.convert.calibration import bounded_layers
    from t2r.models.generation_cache import generation_memory
    from t2r.sources import load_config

    recipe = yaml.safe_load((run / "recipe.yaml").read_text())
    convert = recipe["convert"]
    source = load_config(recipe["model"]["source"])
    layers = convert.get("layers")
    if auto_softmax_count(layers) is not None:
        kept = set(json.loads((run / "layer_ranking" / "ranking.json").read_text())["softmax_layers"])
        layers = [i for i in range(source.num_hidden_layers) if i not in kept]
    layers, layer_options = bounded_layers(layers, source.num_hidden_layers, convert.get("kept_window"))
    config = t2r_config(source, convert["target"], layers, layer_options=layer_options, **convert.get("options", {}))
    return generation_memory(config, element_size=2)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="a run directory kept in benchmarks/results")
    args = parser.parse_args()
    from t2r.eval import frontier

    for run in args.runs:
        fixed = state_bytes_today(run)
        for path in sorted(run.glob("eval-*/results.json")):
            results = json.loads(path.read_text())
            model = next(c for c in results["contenders"] if c["role"] == "model")
            print(f"{path}: {model['name']} {model['state_bytes'] / 2**20:.2f} MiB fixed when evaluated, "
                  f"{fixed / 2**20:.2f} MiB today")
            model["state_bytes"] = fixed
            results["frontier"] = frontier.frontiers(results)
            for line in frontier.summary_lines(results):
                print(line)


if __name__ == "__main__":
    main()
