#!/usr/bin/env bash
# One SmolLM2 student trained and evaluated on one GPU machine (issue 31), across back-to-back device calls.
# Source benchmarks/repro/device_env.sh first (model, data, eval tasks and wheels staged).
#
#   bash benchmarks/repro/student.sh train NAME SECONDS [section.field=value ...]
#        t2r finetune --config recipes/frontier/NAME.yaml for at most SECONDS (SIGINT at the end: the newest
#        checkpoint stays), resuming when runs/NAME holds one; every call's start-up is traced
#        (benchmarks/trace_startup.py: stacks every $STACKS_EVERY s (15) for 300 s in $OUT/NAME-stacks.txt, -stacks-resume.txt
#        when resumed: resumed students spent 36-38 s in `first batches` until the long-document fix, 2026-11-27; 0.4-0.5 s since)
#   bash benchmarks/repro/student.sh eval NAME [flag ...]
#        t2r eval of runs/NAME/final against the source and the window frontier, at 2K (perplexity and KL to
#        the source on 64 rows of held-out documents, of each staged text; MQAR, passkey to 2K, the local tasks)
#        and at 8K (perplexity and KL on 16 packed rows of 8192 tokens, passkey at 4K and 8K)
#   bash benchmarks/repro/student.sh pack NAME     # runs/NAME without weights -> $OUT/NAME.tgz
#
# NAME is a recipe of recipes/frontier/ (run dir runs/NAME) or a path under recipes/ such as repro/smollm2-gsa
# (run dir runs/repro/smollm2-gsa, as those recipes' checkpoint.dir says); logs are $OUT/<NAME, / and @ as ->-train.log.
# NAME@VARIANT trains the same recipe as a run of its own, runs/NAME-VARIANT (name=...-VARIANT is added), for
# settings given as overrides: repro/smollm2-gsa@w64 ... convert.options.window=64 convert.options.sinks=4.
# Students side by side on one host: CUDA_VISIBLE_DEVICES=i for each.
set -u
what=$1 name=$2
shift 2
base=${name%%@*} variant=
[ "$base" != "$name" ] && variant=${name#*@}
recipe=recipes/frontier/$base.yaml
[ -f "$recipe" ] || recipe=recipes/$base.yaml
[ -f "$recipe" ] || { echo "student.sh: no recipe recipes/frontier/$base.yaml or recipes/$base.yaml"; exit 2; }
run=runs/$base named=()
[ -n "$variant" ] && run=runs/$base-$variant named=("name=$(basename "$base")-$variant")
out=${OUT:-/tmp}
tag=${name//\//-} tag=${tag//@/-}    # file names under $OUT: no / or @ (the device tool does not return names with @)
case $what in
train)
    seconds=$1; shift
    resume=(); [ -n "$(ls -d "$run"/step-* 2>/dev/null)" ] && resume=(--resume)
    stacks=$out/$tag-stacks.txt; [ ${#resume[@]} -gt 0 ] && stacks=$out/$tag-stacks-resume.txt
    timeout -s INT -k 30 "$seconds" python3 benchmarks/trace_startup.py --every "${STACKS_EVERY:-15}" --for 300 --stacks "$stacks" -- \
        finetune --config "$recipe" "${named[@]}" "$@" "${resume[@]}" >> "$out/$tag-train.log" 2>&1
    rc=$?
    echo "== $tag train rc $rc"; grep -E "start-up|resumed|step [0-9]+/" "$out/$tag-train.log" | tail -4
    # graphs compiled by the step of each logged row (flat once the run's shapes are known; compiled runs only)
    [ -f "$run/metrics.jsonl" ] && python3 -c "import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
seen = [(r['step'], r['compiled_graphs']) for r in rows if 'compiled_graphs' in r]
print('== graphs by step:', ', '.join(f'{g} at {s}' for i, (s, g) in enumerate(seen) if i == 0 or g != seen[i - 1][1]))
" "$run/metrics.jsonl"
    [ -d "$run/final" ] && echo "== $tag final written"
    ;;
eval)
    # the corpus's held-out part and, when staged, text of another domain (python -m t2r.data.offline_texts
    # sympy-code, carried in .stage/data-*): perplexity and KL to the source judged on each
    texts=.stage/data/validation-00.jsonl.gz
    [ -f .stage/data/sympy-code.jsonl.gz ] && texts=$texts,.stage/data/sympy-code.jsonl.gz
    common=(--model "$run/final" --data "$texts" --data-documents 1024 --batch-size 8
            --windows 32,64,128,256,512,1024,2048 --sinks 4)
    python3 -m t2r.cli eval "${common[@]}" --out "$run/eval-2k" --ppl-length 2048 --ppl-rows 64 \
        --suites ppl,kl,mqar,passkey --mqar-pairs 8,32,64,128 --mqar-prompts 16 --passkey-lengths 512,1024,2048 \
        --passkey-prompts 4 --tasks .stage/eval --lm-eval-limit 300 --lm-eval-max-length 2048 "$@" \
        > "$out/$tag-eval-2k.log" 2>&1
    echo "== $tag eval 2K rc $?"; grep -iE "frontier|below|above" "$run/eval-2k/report.md" | head -12
    python3 -m t2r.cli eval "${common[@]}" --out "$run/eval-8k" --ppl-length 8192 --ppl-rows 16 --pack true \
        --suites ppl,kl,passkey --passkey-lengths 4096,8192 --passkey-prompts 4 --batch-size 2 "$@" \
        > "$out/$tag-eval-8k.log" 2>&1
    echo "== $tag eval 8K rc $?"; grep -iE "frontier|below|above" "$run/eval-8k/report.md" | head -12
    ;;
pack)
    tar czf "$out/$tag.tgz" --exclude=final --exclude='step-*' --exclude='.tmp-*' -C "$(dirname "$run")" "$(basename "$run")" && ls -l "$out/$tag.tgz"
    ;;
*) echo "usage: student.sh train|eval|pack NAME ..."; exit 2 ;;
esac
