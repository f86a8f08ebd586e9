#!/usr/bin/env bash
# Issue 39 on one two-GPU host: the frontier student on one card and on two (DDP, FSDP2), a SIGTERM + --resume
# compared with an uninterrupted run, a SIGKILL of one rank, and Mistral-7B's shape (random weights) under FSDP2.
# Source benchmarks/repro/device_env.sh first (model, data and wheels staged; accelerate in /tmp/site).
#
#   bash benchmarks/repro/two_cards.sh one                 # the frontier recipe to step 100 on card 0 alone
#   RUN=NAME bash benchmarks/repro/two_cards.sh one|ddp    # the same as run NAME (runs/NAME, NAME.log); with
#                                                          # PYTHONPATH=P:$PYTHONPATH PYTHONSAFEPATH=1, the t2r
#                                                          # package under P (`python -m` puts the working
#                                                          # directory ahead of PYTHONPATH unless PYTHONSAFEPATH);
#                                                          # ARGS="section.field=value ..." adds overrides, e.g.
#                                                          # train.tokens_per_step=262144 (4 micro-batches a rank)
#   ROUNDS=3 bash benchmarks/repro/two_cards.sh ab         # one card, then DDP, ROUNDS times alternating (runs
#                                                          # one-1, ddp-1, ...; ARGS for both): each pair's ratio,
#                                                          # in $OUT/ab.txt (two DDP runs back to back on one
#                                                          # machine differed by 12% on 2026-11-28); the runs'
#                                                          # files in $OUT/ab.tgz
#   RUN=NAME DDP_OPTIONS='{"static_graph": true}' bash benchmarks/repro/two_cards.sh ddp   # DDP's constructor
#                                                          # given these arguments too (ddp_options.py)
#   bash benchmarks/repro/two_cards.sh lone                # the recipe alone on each card at once, no process
#                                                          # group (runs lone-0, lone-1; ARGS for both): what two
#                                                          # processes sharing the host cost, without DDP
#   bash benchmarks/repro/two_cards.sh one-thread          # the same with the stream read by a thread (data.reader)
#   bash benchmarks/repro/two_cards.sh ddp | fsdp          # the same steps on both cards (runs/ddp, runs/fsdp)
#   bash benchmarks/repro/two_cards.sh ddp-bf16            # DDP with train.gradient_sync=bf16 (runs/ddp-bf16)
#   bash benchmarks/repro/two_cards.sh ddp-cut | fsdp-cut  # DDP (FSDP2) again, SIGTERM to the launcher after step
#                                                          # 60, then --resume to step 100 (runs/ddp-cut, fsdp-cut)
#   bash benchmarks/repro/two_cards.sh kill-rank           # SIGKILL to rank 1 after step 55, then --resume
#   bash benchmarks/repro/two_cards.sh profile             # torch.profiler over steps 41-44 (STEPS=40:44): card 0,
#                                                          # then each DDP rank; ARGS for both
#   bash benchmarks/repro/two_cards.sh eval NAME...        # perplexity and KL at 2K of runs/NAME/final
#   bash benchmarks/repro/two_cards.sh m7 gsa|gdn          # the 7B shape, 10 steps under FSDP2, saved, reloaded
#                                                          # on one card, generating
#   python benchmarks/repro/compare_runs.py runs/ddp runs/ddp-cut    # losses and final weights side by side
#
# Logs, nvidia-smi samples (2 s) and metrics go to $OUT. The step count is fixed (16 align + 84 distill steps of
# 65,536 tokens: 6.55M tokens), so the students of one card and two see the same tokens in the same order.
set -u
out=${OUT:-/tmp}
accelerate_launch() { python3 -m accelerate.commands.launch "$@"; }
recipe=recipes/frontier/smollm2-gdn-hybrid.yaml
fixed=('data.path=.stage/data/train-00*.jsonl.gz' stages.distill.tokens=5505024 checkpoint.every_steps=50
       checkpoint.keep_last=2 logging.every_steps=5)

watch_gpus() {  # nvidia-smi every 2 s into $out/$1-gpus.csv until the caller kills it
    nvidia-smi --query-gpu=timestamp,index,memory.used,utilization.gpu --format=csv,noheader -l 2 \
        > "$out/$1-gpus.csv" 2>/dev/null &
    gpus_pid=$!
}

finish() {  # finish NAME RC: the run's summary lines and its metrics
    local name=$1 rc=$2
    kill "$gpus_pid" 2>/dev/null
    echo "== $name rc $rc"
    grep -E "start-up|resumed|stopped|step (10|50|84|100)/|rank|Error|error" "$out/$name.log" | tail -12
    [ -f "runs/$name/metrics.jsonl" ] && cp "runs/$name/metrics.jsonl" "$out/$name-metrics.jsonl"
    sort -t, -k2,2 -k3,3n "$out/$name-gpus.csv" 2>/dev/null | awk -F, '{m[$2]=$3} END {for (g in m) print "== card" g " peak" m[g]}'
}

two() {  # two NAME CONFIG PORT [args...]: the frontier recipe on both cards
    local name=$1 config=$2 port=$3; shift 3
    local cli=(-m t2r.cli)  # DDP_OPTIONS (JSON): DDP's constructor gets these too (benchmarks/repro/ddp_options.py)
    [ -n "${DDP_OPTIONS:-}" ] && cli=(benchmarks/repro/ddp_options.py)
    watch_gpus "$name"
    accelerate_launch --config_file "$config" --main_process_port "$port" "${cli[@]}" finetune \
        --config "$recipe" name="$name" "${fixed[@]}" "$@" >> "$out/$name.log" 2>&1
    finish "$name" $?
}

stop_after() {  # stop_after NAME STEP SIGNAL PATTERN: once runs/NAME logged STEP, SIGNAL to the processes matching PATTERN
    local name=$1 step=$2 signal=$3 pattern=$4
    until grep -q "\"step\": $step," "runs/$name/metrics.jsonl" 2>/dev/null; do sleep 0.2; done
    pkill "-$signal" -f -o "$pattern" && echo "== $signal sent after step $step to the oldest process matching $pattern"
}

cut() {  # cut NAME CONFIG PORT: SIGTERM to the launcher after step 60 (a checkpoint at 50), then --resume to step 100
    local name=$1 config=$2 port=$3
    stop_after "$name" 60 TERM "accelerate.commands.launch" &
    two "$name" "$config" "$port"
    ls -d "runs/$name"/step-* 2>/dev/null
    two "$name" "$config" "$port" --resume
}

case $1 in
one|one-thread)  # one-thread: the stream read by a thread of the trainer (data.reader=thread), for the A/B
    reader=(); [ "$1" = one-thread ] && reader=(data.reader=thread)
    run=${RUN:-$1}
    watch_gpus "$run"
    # shellcheck disable=SC2086  # ARGS: overrides split on spaces
    CUDA_VISIBLE_DEVICES=0 python3 -m t2r.cli finetune --config "$recipe" name="$run" "${fixed[@]}" "${reader[@]}" \
        ${ARGS:-} >> "$out/$run.log" 2>&1
    finish "$run" $?
    ;;
ddp)
    # shellcheck disable=SC2086  # ARGS: overrides split on spaces
    two "${RUN:-ddp}" recipes/accelerate/ddp-2gpu.yaml 29511 ${ARGS:-} ;;
lone)
    for card in 0 1; do
        # shellcheck disable=SC2086  # ARGS: overrides split on spaces
        CUDA_VISIBLE_DEVICES=$card python3 -m t2r.cli finetune --config "$recipe" name="lone-$card" "${fixed[@]}" \
            ${ARGS:-} >> "$out/lone-$card.log" 2>&1 &
    done
    wait
    for card in 0 1; do
        cp "runs/lone-$card/metrics.jsonl" "$out/lone-$card-metrics.jsonl" 2>/dev/null
        grep -E "start-up|step 84/" "$out/lone-$card.log" | tail -2
    done
    ;;
ab)
    for round in $(seq 1 "${ROUNDS:-2}"); do
        RUN=one-$round bash "$0" one; RUN=ddp-$round bash "$0" ddp
        { echo "== round $round"; python3 benchmarks/repro/compare_runs.py "$out/one-$round-metrics.jsonl" \
            "$out/ddp-$round-metrics.jsonl" --speed --stage distill | tail -2; } | tee -a "$out/ab.txt"
    done
    # the device returns 8 files from $OUT: the rounds' logs, metrics and nvidia-smi samples as one archive
    (cd "$out" && tar czf ab.tgz one-[0-9]*.* ddp-[0-9]*.* && rm -f one-[0-9]*.* ddp-[0-9]*.*) && ls -l "$out/ab.tgz"
    ;;
fsdp) two fsdp recipes/accelerate/fsdp2-2gpu.yaml 29512 ;;
ddp-bf16) two ddp-bf16 recipes/accelerate/ddp-2gpu.yaml 29517 train.gradient_sync=bf16 ;;
ddp-cut) cut ddp-cut recipes/accelerate/ddp-2gpu.yaml 29513 ;;
fsdp-cut) cut fsdp-cut recipes/accelerate/fsdp2-2gpu.yaml 29518 ;;
kill-rank)
    # rank 1's process is the youngest t2r.cli finetune of the pair: SIGKILL it mid-distill
    ( until grep -q '"step": 55,' runs/kill-rank/metrics.jsonl 2>/dev/null; do sleep 0.2; done
      pkill -KILL -n -f "t2r.cli finetune --config $recipe name=kill-rank" && date +%s.%N > "$out/kill-rank-killed-at"
      echo "== SIGKILL sent to the newest rank" ) &
    two kill-rank recipes/accelerate/ddp-2gpu.yaml 29514
    python3 -c "import sys, time; print(f'== the launcher ended {time.time() - float(sys.argv[1]):.1f} s after the SIGKILL')" \
        "$(cat "$out/kill-rank-killed-at")"
    grep -iE "rank|signal|exit" "$out/kill-rank.log" | tail -6
    ls -d runs/kill-rank/step-* runs/kill-rank/.tmp-* 2>/dev/null
    two kill-rank recipes/accelerate/ddp-2gpu.yaml 29514 --resume
    ;;
profile)  # torch.profiler over steps 41-44 (STEPS=40:44) of card 0 alone, then of each DDP rank (ARGS for both)
    steps=${STEPS:-40:44}
    # shellcheck disable=SC2086  # ARGS: overrides split on spaces
    CUDA_VISIBLE_DEVICES=0 python3 benchmarks/profile_recipe.py "$recipe" name=profile-one \
        checkpoint.dir=runs/profile-one "${fixed[@]}" ${ARGS:-} --steps "$steps" --out "$out/profile-one.md" \
        > "$out/profile-one.log" 2>&1
    echo "== profile one rc $?"
    # shellcheck disable=SC2086
    accelerate_launch --config_file recipes/accelerate/ddp-2gpu.yaml --main_process_port 29516 \
        benchmarks/profile_recipe.py "$recipe" name=profile-ddp checkpoint.dir=runs/profile-ddp "${fixed[@]}" \
        ${ARGS:-} --steps "$steps" --out "$out/profile-ddp-{rank}.md" > "$out/profile-ddp.log" 2>&1
    echo "== profile ddp rc $?"; grep -hE "GPU busy|launches|tokens/s|sat idle" "$out"/profile-*.md | head -20
    ;;
eval)
    shift
    for name in "$@"; do
        python3 -m t2r.cli eval --model "runs/$name/final" --out "runs/$name/eval-2k" \
            --data .stage/data/validation-00.jsonl.gz --data-documents 1024 --batch-size 8 --ppl-length 2048 \
            --ppl-rows 64 --suites ppl,kl --windows 64 --sinks 4 > "$out/$name-eval.log" 2>&1
        echo "== $name eval rc $?"; head -8 "runs/$name/eval-2k/report.md"
        cp "runs/$name/eval-2k/results.json" "$out/$name-eval.json" 2>/dev/null
    done
    ;;
m7)
    target=$2 name=m7-$2 options='{num_slots: 64}'
    [ "$target" = gsa ] || options='{}'
    [ -f /tmp/m7/config.json ] || python3 benchmarks/random_model.py --like mistralai/Mistral-7B-v0.1 --out /tmp/m7 \
        > "$out/m7-random-model.log" 2>&1
    watch_gpus "$name"
    /usr/bin/time -v -o "$out/$name-time.txt" python3 -m accelerate.commands.launch \
        --config_file recipes/accelerate/fsdp2-2gpu.yaml --main_process_port 29515 -m t2r.cli finetune \
        --config recipes/mistral-7b-gsa-20b.yaml model.source=/tmp/m7 name="$name" convert.target="$target" \
        "convert.options=$options" 'data.path=.stage/data/train-00a.jsonl.gz' data.streaming=false data.held_out=4 \
        'stages=[{name: distill, loss: {kl: 0.9, next_token: 0.1}}]' train.trainable=attention \
        train.micro_batch_size=2 train.tokens_per_step=16384 train.max_tokens=163840 train.warmup_steps=2 \
        logging.every_steps=1 >> "$out/$name.log" 2>&1
    finish "$name" $?
    grep -E "Maximum resident" "$out/$name-time.txt"
    du -sh "runs/$name/final" 2>/dev/null
    CUDA_VISIBLE_DEVICES=0 /usr/bin/time -v -o "$out/$name-generate-time.txt" python3 -m t2r.cli generate \
        --model "runs/$name/final" --prompt "The capital of France is" --max-new-tokens 16 > "$out/$name-generate.log" 2>&1
    echo "== $name generate rc $?"; tail -4 "$out/$name-generate.log"
    grep -E "Elapsed|Maximum resident" "$out/$name-generate-time.txt"
    ;;
*) echo "usage: two_cards.sh one|ab|lone|one-thread|ddp|fsdp|ddp-bf16|ddp-cut|fsdp-cut|kill-rank|profile|eval NAME...|m7 gsa|gdn"; exit 2 ;;
esac
