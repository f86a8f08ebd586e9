#!/usr/bin/env bash
# Students side by side, one per card of one host (issue 38's table), each through benchmarks/repro/student.sh.
# Source benchmarks/repro/device_env.sh first. From the repository root:
#
#   bash benchmarks/repro/seeds.sh train SECONDS NAME... [-- override ...]   # student i on card i, resumed when
#                                                                            # its run holds a checkpoint
#   bash benchmarks/repro/seeds.sh eval NAME... [-- flag ...]                 # student.sh eval, one per card
#   bash benchmarks/repro/seeds.sh pack NAME...
#
# NAME as student.sh takes it (repro/smollm2-gsa, smollm2-gdn-hybrid, ...). Each student's own output goes to
# $OUT/<NAME, / as ->-<what>.out, its logs where student.sh puts them; nvidia-smi samples every 30 s go to
# $OUT/gpus-<what>.csv (utilization and memory per card: the students share the host's CPUs).
set -u
what=$1; shift
seconds=(); [ "$what" = train ] && { seconds=("$1"); shift; }
names=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do names+=("$1"); shift; done
[ "${1:-}" = -- ] && shift
out=${OUT:-/tmp}
cards=$(nvidia-smi -L 2>/dev/null | wc -l)
[ "${#names[@]}" -le "${cards:-0}" ] || { echo "seeds.sh: ${#names[@]} students for ${cards:-0} cards"; exit 2; }
nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv -l 30 > "$out/gpus-$what.csv" 2>/dev/null &
smi=$!
i=0
for name in "${names[@]}"; do
    CUDA_VISIBLE_DEVICES=$i bash benchmarks/repro/student.sh "$what" "$name" "${seconds[@]}" "$@" \
        > "$out/${name//\//-}-$what.out" 2>&1 &
    i=$((i + 1))
done
wait $(jobs -p | grep -vx "$smi")
kill "$smi" 2>/dev/null
for name in "${names[@]}"; do cat "$out/${name//\//-}-$what.out"; done
