# Stage the repro experiment's files on the GPU machine and set up its environment (issue 19).
# SOURCE it from the repository root, at the start of every device call (it exports variables):
#
#   source benchmarks/repro/device_env.sh            # stage what this call carried, report; rc 1 only on error
#   source benchmarks/repro/device_env.sh --ready && t2r run --config recipes/repro/smollm2-gsa.yaml
#                                                    # same, rc 1 unless model, data, eval tasks and both
#                                                    # wheel sets are all staged; then `t2r_pack smollm2-gsa`
#
# Each call may carry some of .stage/{model-a,model-b,wheels-core,wheels-lmeval,data,data-*,eval} (recipes/repro/README.md
# says which); they accumulate in /tmp/t2r-stage, which lasts while the machine stays warm (30 s after a call).
# Idempotent: wheels are installed into /tmp/site once each, the GGUF is joined from its two halves and checked
# against its sha256 into $T2R_CACHE once, and load_source("smollm2") then writes the dense copy there once.
# .stage/data and .stage/eval in the repository become links to the staged copies, so recipes' paths resolve.
# Overrides for a dry run elsewhere: T2R_STAGE_DIR, T2R_CACHE, T2R_SITE, T2R_PYTHON.

_t2r_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
_t2r_stage=${T2R_STAGE_DIR:-/tmp/t2r-stage}
_t2r_site=${T2R_SITE:-/tmp/site}
_t2r_py=${T2R_PYTHON:-python3}
_t2r_gguf=SmolLM2-135M-Instruct.Q4_1.gguf
export T2R_CACHE=${T2R_CACHE:-/tmp/t2r-cache}
# .stage/src, when carried, holds a committed snapshot of the t2r package (git archive HEAD t2r): it replaces the
# device's copy of the working tree's t2r/, which may hold unfinished edits.
[ -d "$_t2r_root/.stage/src/t2r" ] && rm -rf "$_t2r_root/t2r" && cp -r "$_t2r_root/.stage/src/t2r" "$_t2r_root/t2r"
export PYTHONPATH=$_t2r_root:$_t2r_site${PYTHONPATH:+:$PYTHONPATH}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
t2r() { "$_t2r_py" -m t2r.cli "$@"; }
# t2r: the command line from the repository (on PYTHONPATH there, not installed): a script on PATH, so that
# `timeout 540 t2r run ...` works too
mkdir -p /tmp/t2r-bin && printf '#!/bin/sh\nexec python3 -m t2r.cli "$@"\n' > /tmp/t2r-bin/t2r && chmod +x /tmp/t2r-bin/t2r
case ":$PATH:" in *:/tmp/t2r-bin:*) ;; *) export PATH="/tmp/t2r-bin:$PATH" ;; esac
# t2r_pack NAME: runs/repro/NAME without its weights (final/, step-*/) as $OUT/NAME.tgz, for the device tool to return
t2r_pack() { tar czf "${OUT:-/tmp}/$1.tgz" -C "$_t2r_root/runs/repro" --exclude=final --exclude='step-*' \
    --exclude='.tmp-*' "$1" && ls -l "${OUT:-/tmp}/$1.tgz"; }

_t2r_env() {
    local S=$_t2r_stage R=$_t2r_root err=0 ready=() d w new=()
    mkdir -p "$S"/{model,wheels,data,eval,installed} "$T2R_CACHE" "$_t2r_site" "$R/.stage"
    # 1. accumulate what this call carried
    for d in model-a model-b; do [ -d "$R/.stage/$d" ] && cp -rf "$R/.stage/$d/." "$S/model/"; done
    for d in wheels-core wheels-lmeval; do [ -d "$R/.stage/$d" ] && cp -rf "$R/.stage/$d/." "$S/wheels/"; done
    # .stage/data-*: parts of the data, for calls that cannot carry all of it at once
    for d in "$R"/.stage/data-*; do [ -d "$d" ] && cp -rf "$d/." "$S/data/"; done
    for d in data eval; do
        if [ -d "$R/.stage/$d" ] && [ ! -L "$R/.stage/$d" ]; then cp -rf "$R/.stage/$d/." "$S/$d/"; rm -rf "$R/.stage/$d"; fi
        [ -e "$R/.stage/$d" ] || ln -s "$S/$d" "$R/.stage/$d"
    done
    # 2. wheels not installed yet, in one pip call
    for w in "$S"/wheels/*.whl; do [ -e "$w" ] && [ ! -e "$S/installed/${w##*/}" ] && new+=("$w"); done
    if [ ${#new[@]} -gt 0 ]; then
        if "$_t2r_py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
                --target "$_t2r_site" "${new[@]}"; then
            for w in "${new[@]}"; do touch "$S/installed/${w##*/}"; done
            echo "device_env: installed ${#new[@]} wheels into $_t2r_site"
        else echo "device_env: ERROR: pip install failed"; err=1; fi
    fi
    # 3. the GGUF from its halves, checked
    if [ ! -f "$T2R_CACHE/$_t2r_gguf" ] && [ -f "$S/model/$_t2r_gguf.part0" ] && [ -f "$S/model/$_t2r_gguf.part1" ]; then
        cat "$S/model/$_t2r_gguf.part0" "$S/model/$_t2r_gguf.part1" > "$T2R_CACHE/$_t2r_gguf.tmp"
        if (cd "$T2R_CACHE" && sed "s/ *$_t2r_gguf\$/  $_t2r_gguf.tmp/" "$S/model/$_t2r_gguf.sha256" | sha256sum -c --quiet -); then
            mv "$T2R_CACHE/$_t2r_gguf.tmp" "$T2R_CACHE/$_t2r_gguf"; echo "device_env: GGUF joined, sha256 ok"
        else rm -f "$T2R_CACHE/$_t2r_gguf.tmp"; echo "device_env: ERROR: GGUF sha256 mismatch"; err=1; fi
    fi
    # 4. the dense copy (load_source writes it on first use; ~20 s), once gguf is installed
    if [ -f "$T2R_CACHE/$_t2r_gguf" ] && [ ! -f "$T2R_CACHE/SmolLM2-135M-Instruct/config.json" ] \
            && [ -e "$_t2r_site/gguf" ]; then
        "$_t2r_py" -c "from t2r.sources import load_source; load_source('smollm2')" >/dev/null 2>&1 \
            || { echo "device_env: ERROR: load_source('smollm2') failed"; err=1; }
    fi
    # 5. report
    [ -f "$T2R_CACHE/SmolLM2-135M-Instruct/config.json" ] && ready+=(model)
    ls "$S"/data/train-*.jsonl.gz >/dev/null 2>&1 && [ -f "$S/data/validation-00.jsonl.gz" ] && ready+=(data)
    ls "$S"/eval/*.jsonl >/dev/null 2>&1 && ready+=(eval)
    [ -e "$_t2r_site/datasets" ] && [ -e "$_t2r_site/gguf" ] && ready+=(core)
    [ -e "$_t2r_site/lm_eval" ] && ready+=(lmeval)
    export T2R_READY="${ready[*]}"
    echo "device_env: $(find "$S"/{model,data,eval,wheels} -type f | wc -l) files staged in $S; ready: ${T2R_READY:-nothing}"
    [ -e "$_t2r_site/datasets" ] && "$_t2r_py" -c "
import importlib.metadata as m
v = {}
for p in ('pyarrow', 'fsspec', 'pandas', 'huggingface-hub', 'datasets', 'gguf', 'lm-eval'):
    try: v[p] = m.version(p)
    except m.PackageNotFoundError: pass
print('device_env: versions', ', '.join(f'{p} {x}' for p, x in v.items()))
if int(v.get('pyarrow', '0').split('.')[0]) < 24: print('device_env: WARNING: datasets 5.2 asks for pyarrow>=24')
"
    return $err
}
_t2r_env_rc=0
_t2r_env || _t2r_env_rc=1
if [ "${1:-}" = --ready ] && [ "$T2R_READY" != "model data eval core lmeval" ]; then
    echo "device_env: not ready (need model data eval core lmeval)"; _t2r_env_rc=1
fi
(exit $_t2r_env_rc)
