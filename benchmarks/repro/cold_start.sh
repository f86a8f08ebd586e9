#!/usr/bin/env bash
# The frontier student's start-up as on a fresh machine, before and after a change, side by side on one machine
# (issue 37). Source benchmarks/repro/device_env.sh first (model, data and wheels staged).
#
#   bash benchmarks/repro/cold_start.sh NAME SECONDS [PACKAGE] [section.field=value ...]
#        empties Triton's and Inductor's caches (~/.triton, /tmp/torchinductor_$USER: what a fresh machine lacks;
#        the dense SmolLM2 copy and the page cache stay), then `t2r finetune` of
#        recipes/frontier/smollm2-gdn-hybrid.yaml as run NAME for SECONDS (SIGINT: its start-up line is printed
#        after the first step), with the t2r package under PACKAGE when given (`mkdir -p P && git archive COMMIT
#        t2r | tar -x -C P`: the code before a change; PYTHONSAFEPATH=1, since `python -m` puts the working
#        directory, this checkout, ahead of PYTHONPATH). The log is $OUT/NAME.log; its start-up line is printed,
#        with the t2r that ran.
set -u
name=$1 seconds=$2
shift 2
package=
if [ $# -gt 0 ] && [ -d "$1/t2r" ]; then package=$(cd "$1" && pwd); shift; fi
out=${OUT:-/tmp}
rm -rf ~/.triton "/tmp/torchinductor_$(id -un)"
[ -n "${TRITON_CACHE_DIR:-}" ] && rm -rf "$TRITON_CACHE_DIR"
safe=; [ -n "$package" ] && safe=1
PYTHONPATH=${package:+$package:}${PYTHONPATH:-} PYTHONSAFEPATH=$safe python3 -c 'import t2r; print("t2r from", t2r.__file__)' \
    > "$out/$name.log" 2>&1
PYTHONPATH=${package:+$package:}${PYTHONPATH:-} PYTHONSAFEPATH=$safe timeout -s INT -k 30 "$seconds" python3 -m t2r.cli \
    finetune --config recipes/frontier/smollm2-gdn-hybrid.yaml name="$name" "$@" >> "$out/$name.log" 2>&1
echo "== $name rc $? ($(head -1 "$out/$name.log")): $(grep -m1 -o 'start-up: .*' "$out/$name.log")"
grep -m2 -E "rank layers .*(ready|layer 29 )" "$out/$name.log"
python3 -c "import json, sys; print('== kept softmax:', json.load(open(sys.argv[1]))['softmax_layers'])" \
    "runs/$name/layer_ranking/ranking.json" 2>/dev/null
