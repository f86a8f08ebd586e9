#!/usr/bin/env bash
# Everything a GPU session checks: the GPU tests (one pytest process per file, so a
# CUDA fault in one cannot poison the others), then every benchmark table. Logs and tables go to $OUT
# (the device tool brings that folder back) or benchmarks/results.
#   bash benchmarks/gpu_session.sh tests      # all GPU tests (about 10 minutes on an H100, mostly compiling)
#   bash benchmarks/gpu_session.sh tests tests/ops/test_triton_gla.py ...   # only these files
#   bash benchmarks/gpu_session.sh bench      # benchmark tables only (about 5 minutes)
#   bash benchmarks/gpu_session.sh train      # whole-model training table, eager vs torch.compile (about 5 minutes)
#   bash benchmarks/gpu_session.sh            # both: more than one 10-minute device call holds
# Measured on the H100 (2026-11-22): test_triton_gla 200 s, test_triton_gsa 170 s, test_triton_fox 105 s,
# models/test_cuda 70 s, test_triton_utils 28 s, test_gla + test_gsa 30 s: two device calls, e.g. the gla and
# gsa files in one and the rest in the other.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
out=${OUT:-benchmarks/results}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.txt"
mode=${1:-all}
files=("${@:2}")
[ ${#files[@]} -gt 0 ] || files=(tests/ops/test_triton_utils.py tests/ops/test_triton_gla.py tests/ops/test_triton_gsa.py
                                 tests/ops/test_triton_fox.py tests/ops/test_gla.py tests/ops/test_gsa.py
                                 tests/models/test_cuda.py)
case $mode in bench|train) ;; *) false ;; esac || for test_file in "${files[@]}"; do
    echo "== $test_file"
    timeout 300 python -m pytest -q --tb=short -p no:cacheprovider "$test_file" 2>&1 | tail -15
done | tee "$out/gpu_tests.log"
[ "$mode" = tests ] && exit 0
if [ "$mode" = train ]; then  # whole-model training, eager and compiled, side by side (about 5 minutes)
    timeout 300 python benchmarks/bench_train.py --shape smollm2 --contexts 2048 16384 --tokens-per-step 16384 --targets gsa retnet gla --hybrid-every 0 --modes eager compiled --out "$out/train_eager_vs_compiled.md" 2>&1 | tail -12
    exit 0
fi
timeout 300 python benchmarks/bench_linear_ops.py --no-fla 2>&1 | tee "$out/bench_linear_ops.log" | tail -40
timeout 200 python benchmarks/bench_gsa.py --out "$out" 2>&1 | tail -20
timeout 200 python benchmarks/bench_fox.py --out "$out" 2>&1 | tail -20
timeout 200 python benchmarks/bench_generate.py --batch 16 --contexts 2048 8192 32768 2>&1 | tail -20
