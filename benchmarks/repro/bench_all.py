"""Speed and memory of the source and every trained student, in one process and one table:
`python benchmarks/repro/bench_all.py OUT_DIR [contexts] [batch sizes]` (default 2K,8K,32K and 1,16,64)."""

import json
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from t2r.eval import bench
from t2r.eval.suite import label
from t2r.sources import load_source

out = Path(sys.argv[1])
contexts = bench.parse_sizes(sys.argv[2] if len(sys.argv) > 2 else "2K,8K,32K")
batches = bench.parse_sizes(sys.argv[3] if len(sys.argv) > 3 else "1,16,64")
models = ["smollm2"] + sorted(str(p.parent) for p in Path("runs/repro").glob("*/final/config.json"))
rows = []
for spec in models:
    model, _ = load_source(spec, dtype=torch.bfloat16, device="cuda")
    name = label(model) if spec != "smollm2" else "source"
    name = f"{name} ({Path(spec).parent.name})" if "hybrid" in spec else name
    rows += bench.bench_model(model, name, contexts, batches, decode_tokens=16, allow_beyond=True)
    del model
    torch.cuda.empty_cache()
out.mkdir(parents=True, exist_ok=True)
table = bench.format_table(rows)
(out / "bench.md").write_text(f"{torch.cuda.get_device_name()}, bf16, `python {' '.join(sys.argv)}`\n\n{table}\n")
(out / "bench.json").write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
bench.plot(rows, out)
print(table)
