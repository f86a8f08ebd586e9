"""What torch.compile's caches give a resumed run's first step, on the CPU: a tiny compiled recipe of two stages
(attention MSE, then KL) trained in one process until a checkpoint mid-distillation, then resumed in another,
with Inductor's cache in a directory of its own (empty at the start). Prints each process's start-up line and the
line after it: the graphs compiled by the first step and the caches' hits and misses. A resume whose first step
misses compiles graphs the stopped run never made (on an H100, 2026-11-28: the teacher's graph, which the
attention-MSE stage had broken in two with its hooks).

    python benchmarks/resume_compile_cache.py [--package DIR]    # DIR: another t2r (`git archive COMMIT t2r`)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RUN = """
import sys
mode, stop_at, config = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sys.argv = ["t2r"]
from t2r.train import Interrupt, finetune, load_recipe


def stop(metrics):
    if metrics["step"] >= stop_at:
        raise Interrupt("stopped")


try:
    finetune(load_recipe(config), resume=mode == "resume", callbacks=[stop])
except Interrupt:
    pass
"""


def recipe(tmp: Path) -> Path:
    sys.path.insert(0, str(ROOT))
    from tests.helpers.models import save_tiny_source
    from tests.helpers.recipes import write_corpus

    source, corpus = save_tiny_source(tmp / "source"), write_corpus(tmp / "train.jsonl")
    path = tmp / "recipe.yaml"
    path.write_text(textwrap.dedent(f"""
        name: cache
        model: {{source: "{source}", dtype: float32}}
        convert: {{target: gdn, layers: "0"}}
        data: {{path: "{corpus}", seq_len: 32, held_out: 0, document_boundaries: true}}
        train: {{lr: 3.0e-3, warmup_steps: 0, tokens_per_step: 128, micro_batch_size: 2, compile: true,
                 mixed_precision: "no", seed: 0}}
        stages:
          - {{name: align, loss: attention_mse, tokens: 256, trainable: attention, lr: 1.0e-3}}
          - {{name: distill, loss: {{kl: 0.9, next_token: 0.1}}, tokens: 1280}}
        checkpoint: {{dir: "{tmp / 'run'}", every_steps: 1, keep_last: 2}}
        logging: {{every_steps: 1, plot: false}}
    """))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--package", help="a directory holding another t2r package, run instead of this checkout")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        config = recipe(tmp)
        script = tmp / "run.py"
        script.write_text(RUN)
        package = str(Path(args.package).resolve()) if args.package else str(ROOT)
        env = {**os.environ, "PYTHONPATH": package, "PYTHONSAFEPATH": "1",
               "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor")}
        for mode, stop_at in (("fresh", 5), ("resume", 7)):  # 2 align steps, then distill; stopped at 5, resumed
            done = subprocess.run([sys.executable, str(script), mode, str(stop_at), str(config)], env=env,
                                  capture_output=True, text=True, timeout=900, cwd=tmp)
            lines = [line for line in (done.stdout + done.stderr).splitlines()
                     if line.startswith(("start-up:", "resumed from")) or "compiled graphs by" in line]
            print(f"== {mode} (t2r from {package}, rc {done.returncode})")
            print("\n".join(lines) if lines else (done.stdout + done.stderr)[-2000:])


if __name__ == "__main__":
    main()
