#!/usr/bin/env bash
# First, short GPU call of a session: proves the real cuda-python runner, the search's cuda backend and
# the bench launcher on one example before the long run (scripts/gpu_check.sh). ~2-3 minutes.
#   bash scripts/gpu_smoke.sh        (on the GPU machine; logs and a small DB land in $OUT)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_smoke_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
[ -f .gpu/setup.sh ] && bash .gpu/setup.sh
S=$(date +%s)
run() { local name=$1 cap=$2; shift 2; local t0=$(date +%s)
  timeout --kill-after=5 "$cap" "$@" >"$OUT/$name.log" 2>&1; local rc=$?
  echo "== $name rc=$rc $(( $(date +%s) - t0 ))s"; tail -n 12 "$OUT/$name.log"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv > "$OUT/nvidia_smi.log" 2>&1; cat "$OUT/nvidia_smi.log"
run devices 60 python3 -m stitchtune devices --check
STITCHTUNE_GPU_SAMPLES=1 run gpu_tests 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_gpu.py tests/emulate/test_emulator.py
run search_ln 90 python3 -m stitchtune search examples/layernorm.json --backend cuda --trials 10 --db "$OUT/db" --seed 0
run bench_ln 120 python3 -m stitchtune bench examples/layernorm.json --db "$OUT/db" -o "$OUT/bench" --peers eager,xla,inductor --iters 50 --warmup 5
tar -czf "$OUT/smoke_db.tar.gz" -C "$OUT" db bench 2>/dev/null; rm -rf "$OUT/db" "$OUT/bench"
echo "total $(( $(date +%s) - S ))s"
