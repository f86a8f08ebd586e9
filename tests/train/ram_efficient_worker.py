"""Run by `test_fsdp.py` under torchrun (2 CPU processes, gloo) with accelerate's FSDP RAM-efficient loading
switched on in the environment: build a recipe's model as finetuning does, and write what each rank holds."""

import json
import sys
from pathlib import Path

import torch.distributed as dist

from tests.helpers.recipes import recipe


def main(tmp: str, source_dir: str, corpus: str) -> None:
    from t2r.train.model_setup import build_model, place_teacher
    from t2r.train.recipe import load_recipe

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    overrides = {"stages.distill": "{weight: 1.0}", "convert.layers": "auto:1"}
    if rank == 0:  # one writer of run.yaml: a rank reading it while another rewrote it once saw it half-written
        recipe(Path(tmp), source_dir, corpus, **overrides)
    dist.barrier()
    tiny = load_recipe(Path(tmp) / "run.yaml", [f"{k}={v}" for k, v in overrides.items()])
    model, _, teacher = build_model(tiny)
    reused = [p for n, p in model.named_parameters() if "q_proj" in n or "embed_tokens" in n]
    before = float(sum(p.abs().sum() for p in reused))
    place_teacher(teacher, "cpu")
    report = {"student_reused_abs_sum": before, "mixers": model.config.t2r_mixers,
              "teacher_sum": float(sum(t.double().sum() for t in teacher.state_dict().values()))}
    (Path(tmp) / f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
