#!/usr/bin/env bash
# Issue 30 on one GPU machine: where a staged SmolLM2 -> GSA + window 64 + 4 sinks run's start goes (the start-up
# line and startup.json), and align / distill tokens/s with the fused KL against the plain KL, in one call.
# Needs model, data and the core wheels staged (benchmarks/repro/device_env.sh); about 8 minutes on an H100.
#   source benchmarks/repro/device_env.sh && bash benchmarks/startup_and_distill.sh
set -u
out=${OUT:-runs/startup}
mkdir -p "$out"
common=(--config recipes/smollm2-staged-h100.yaml data.path=.stage/data/train-00.jsonl.gz data.held_out=16
        convert.options.window=64 convert.options.sinks=4 stages.align.tokens=393216 stages.distill.tokens=655360
        stages.finetune.tokens=131072 logging.every_steps=1 logging.plot=false checkpoint.every_steps=100000
        checkpoint.keep_last=1)
for run in fused plain; do
    fused=true; [ $run = plain ] && fused=false
    timeout 280 python3 -m t2r.cli finetune "${common[@]}" name=startup-$run train.fused_kl=$fused \
        checkpoint.dir=runs/startup-$run --overwrite 2>&1 | grep -v "^ *$" > "$out/$run.log"
    echo "== $run (rc ${PIPESTATUS[0]})"; grep -E "start-up|step 1/|step [0-9]+/[0-9]+ " "$out/$run.log" | tail -25
    cp runs/startup-$run/startup.json "$out/startup-$run.json" 2>/dev/null
    python3 - "$run" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(f"runs/startup-{sys.argv[1]}/metrics.jsonl") if '"loss"' in l]
for stage in ("align", "distill", "finetune"):
    speeds = [r["tokens_per_s"] for r in rows if r.get("stage") == stage][1:]  # the first step compiles
    if speeds:
        print(f"{sys.argv[1]} {stage}: median {statistics.median(speeds):,.0f} tokens/s over {len(speeds)} steps")
PY
done
