#!/usr/bin/env bash
# Issue 19: the stage-1 / learning-rate sweep of the GSA student at a short token budget, before the full students.
# From the repository root, after `source benchmarks/repro/device_env.sh` (PYTHONPATH, T2R_CACHE, staged data):
#
#   bash benchmarks/repro/sweep.sh [TAG ...]          # default: A B C D E, one at a time
#
# Each configuration is `t2r finetune --config recipes/repro/smollm2-gsa.yaml name=sweep-TAG ...` (run dir
# runs/repro/sweep-TAG), at SWEEP_TOKENS tokens (default 2,000,000) with 10 warmup steps:
#   A: no stage 1, lr 3e-4               B: no stage 1, lr 1e-4
#   C: stage 1 on the new gates only (100 micro-batches, lr 1e-3), then lr 3e-4
#   D: stage 1 on all attention weights (q/k/v/o + gates) at lr 1e-4, then lr 3e-4
#   E: stage 1 on all attention weights at lr 1e-3 (the recipes' round-1 setting), then lr 3e-4
# Every run goes through benchmarks/repro/t2r_stage1_fix.py (t2r's CLI with stage 1's autocast cast cache cleared
# after each step; without it stage 1 never sees its own updates, see that file); SWEEP_CLI="-m t2r.cli" for plain t2r.
# Logs go to SWEEP_LOGS (default /tmp/sweep-logs): one per configuration, gpu.log (nvidia-smi every 60 s) and
# summary.md (first/last KL, held-out loss, stage-1 MSE, throughput, wall time), also printed at the end.
# More environment: SWEEP_JOBS (runs at a time, default 1: one run at micro-batch 8 peaks at ~48 GiB on the H100,
# so two OOM there; add train.micro_batch_size=4 to SWEEP_EXTRA for two), SWEEP_DEADLINE_S (no run starts after
# this many seconds, and each run is stopped there: the summary still prints; default none), SWEEP_EXTRA
# (overrides added to every run, e.g. for a CPU check: "data.seq_len=128 train.tokens_per_step=256
# train.micro_batch_size=2"), SWEEP_DRY=1 (--dry-run only).
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PY=${T2R_PYTHON:-python3}
LOGS=${SWEEP_LOGS:-/tmp/sweep-logs}
TOKENS=${SWEEP_TOKENS:-2000000}
JOBS=${SWEEP_JOBS:-1}
CLI=${SWEEP_CLI:-benchmarks/repro/t2r_stage1_fix.py}
DEADLINE=${SWEEP_DEADLINE_S:-}
RECIPE=recipes/repro/smollm2-gsa.yaml
mkdir -p "$LOGS"

overrides() {  # the overrides of one configuration
    case $1 in
        A) echo "stages.attention_transfer=null train.lr=3e-4" ;;
        B) echo "stages.attention_transfer=null train.lr=1e-4" ;;
        C) echo "stages.attention_transfer.params=gates stages.attention_transfer.lr=1e-3 train.lr=3e-4" ;;
        D) echo "stages.attention_transfer.params=attention stages.attention_transfer.lr=1e-4 train.lr=3e-4" ;;
        E) echo "stages.attention_transfer.params=attention stages.attention_transfer.lr=1e-3 train.lr=3e-4" ;;
        *) echo "sweep: unknown configuration $1" >&2; return 1 ;;
    esac
}

run_one() {
    local tag=$1 limit=$2 t0=$SECONDS rc args
    args=$(overrides "$tag") || return 1
    # shellcheck disable=SC2086  # the overrides and the CLI are words
    timeout "$limit" $PY $CLI finetune --config $RECIPE name=sweep-$tag train.max_tokens=$TOKENS train.warmup_steps=10 \
        $args ${SWEEP_EXTRA:-} ${SWEEP_DRY:+--dry-run} --overwrite >"$LOGS/sweep-$tag.log" 2>&1
    rc=$?
    echo "sweep-$tag: rc $rc, $((SECONDS - t0)) s, overrides: $args ${SWEEP_EXTRA:-}" | tee -a "$LOGS/sweep-$tag.log"
    return $rc
}

TAGS=("$@"); [ ${#TAGS[@]} -gt 0 ] || TAGS=(A B C D E)
for tag in "${TAGS[@]}"; do overrides "$tag" >/dev/null || exit 2; done

# the datasets cache of the training files, built once here instead of by concurrent runs
[ -n "${SWEEP_DRY:-}" ] || $PY -c "
from t2r.train import load_recipe
from t2r.data.sources import open_dataset
print('sweep: training data', open_dataset(load_recipe('$RECIPE').data))" 2>&1 | tail -3

GPU_PID=
if [ -z "${SWEEP_DRY:-}" ] && command -v nvidia-smi >/dev/null; then
    (while sleep 60; do echo "$(date +%T) $(nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader)"
     done) >"$LOGS/gpu.log" 2>&1 &
    GPU_PID=$!
fi
t_all=$SECONDS
running=0
for tag in "${TAGS[@]}"; do
    if [ $running -ge "$JOBS" ]; then wait -n; running=$((running - 1)); fi
    left=100000; [ -n "$DEADLINE" ] && left=$((DEADLINE - (SECONDS - t_all)))
    if [ "$left" -lt 90 ]; then echo "sweep-$tag: not started, ${left} s left before the deadline"; continue; fi
    run_one "$tag" "$left" &
    running=$((running + 1))
    sleep 5   # stagger the starts (source load, kernel compiles)
done
while [ $running -gt 0 ]; do wait -n; running=$((running - 1)); done   # the runs (not the GPU monitor)
[ -n "$GPU_PID" ] && kill "$GPU_PID" 2>/dev/null
echo "sweep: all ${#TAGS[@]} runs in $((SECONDS - t_all)) s"
[ -n "$GPU_PID" ] && { echo "sweep: GPU memory used, utilization (every 60 s):"; cat "$LOGS/gpu.log"; }

# the summary: one row per configuration
[ -n "${SWEEP_DRY:-}" ] && exit 0
$PY - "$LOGS" "${TAGS[@]}" <<'EOF' | tee "$LOGS/summary.md"
import json, re, statistics, sys
from pathlib import Path
logs, tags = Path(sys.argv[1]), sys.argv[2:]
print("| run | overrides | stage-1 MSE first -> last | KL step 1 | KL max | KL last (mean of last 5) | held-out loss (ppl) | tokens/s (median) | wall s |")
print("|---|---|---|---|---|---|---|---|---|")
for tag in tags:
    run = Path("runs/repro") / f"sweep-{tag}"
    tail = (logs / f"sweep-{tag}.log").read_text().strip().splitlines()[-1] if (logs / f"sweep-{tag}.log").exists() else ""
    m = re.match(r"sweep-\S+: rc (\d+), (\d+) s, overrides: (.*)", tail)
    rc, wall, over = (m.group(1), m.group(2), m.group(3).strip()) if m else ("?", "?", "?")
    steps = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines() if l.strip()] \
        if (run / "metrics.jsonl").exists() else []
    steps = [s for s in steps if "loss" in s]
    final = json.loads((run / "final_metrics.json").read_text()) if (run / "final_metrics.json").exists() else {}
    if not steps:
        print(f"| {tag} | {over} | | | | | | | {wall} (rc {rc}) |")
        continue
    mse = final.get("attention_transfer_mse") or []
    mse = f"{mse[0]:.3f} -> {mse[-1]:.3f}" if mse else "none"
    losses = [s["loss"] for s in steps]
    last5 = statistics.mean(losses[-5:])
    tps = statistics.median(s["tokens_per_s"] for s in steps[3:] or steps)
    val = final.get("validation_loss")
    val = f"{val:.3f} ({final['validation_ppl']:.0f})" if val is not None else "?"
    print(f"| {tag} | {over} | {mse} | {losses[0]:.2f} | {max(losses):.2f} | {losses[-1]:.2f} ({last5:.2f}) "
          f"| {val} | {tps:,.0f} | {wall}{'' if rc == '0' else f' (rc {rc})'} |")
EOF
