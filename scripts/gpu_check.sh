#!/usr/bin/env bash
# The one script the lead runs on a lent GPU machine (one H200, a few minutes of device time).
#
#   GPU machine:  bash scripts/gpu_check.sh                 # results + logs land in $OUT
#   CPU dry run:  DRY_RUN=1 OUT=/tmp/gpucheck bash scripts/gpu_check.sh
#
# Steps (each under `timeout`, the whole script within BUDGET_S seconds, default 470 = under 8 minutes):
#   setup       install the device wheels (.gpu/setup.sh) unless pycuda already imports
#   gpu_info    nvidia-smi (DRY_RUN: skipped)
#   versions    python / numpy / pycuda / optuna / nvcc versions
#   gpu_tests   pytest -m gpu tests/test_gpu.py (fault -> launch_error, hang -> timeout, >48K smem,
#               sampled full-size schedules vs the reference; one JSON line per program run in
#               gpu_schedules.jsonl). Without pytest on the machine: an inline pycuda smoke test of
#               the same fault/hang/ok cases. DRY_RUN: the fake-GPU worker tests of test_runners.py.
#   search_*    `stitchtune search` per example (cuda backend; DRY_RUN: emulate, small examples)
#   bench       `stitchtune bench` on the examples searched: eager, XLA, Inductor (DRY_RUN: eager only;
#               fails without cupy)
#   torch_entry scripts/gpu_torch_entry.py: stitchtune.compile via pycuda on the small examples and
#               stitchtune.torch.compile next to eager and torch.compile
#   bench_max   torch.compile max-autotune-no-cudagraphs with the time left
# Then everything is bundled into $OUT (at most 5 files) and a short table is printed last.
#
# Knobs: DRY_RUN, OUT, BUDGET_S, GPU_SAMPLES (schedules per example in gpu_tests, default 2),
# TRIALS (per search, default 64; DRY_RUN 6), SEARCH_EXAMPLES (space-separated paths),
# SEARCH_CAP_S (per search, default 30), SEARCH_TIMEOUT_S (the search's own --timeout, default 20),
# BENCH_CAP_S (default 110), GPU_TESTS_CAP_S (default 60). For complete 64-trial searches (issue 5) give
# the searches more room, e.g. BUDGET_S=580 SEARCH_CAP_S=45 SEARCH_TIMEOUT_S=35 (about 10 minutes).
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
DRY_RUN=${DRY_RUN:-0}
BUDGET_S=${BUDGET_S:-470}
OUT=${OUT:-$(mktemp -d /tmp/gpu_check_out.XXXXXX)}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/gpu_check_work.XXXXXX)
mkdir -p "$WORK/logs"
T_START=$(date +%s)
STEPS=()   # "name|status|rc|seconds|note"
PY=${PYTHON:-python3}

if [ "$DRY_RUN" = 1 ]; then
  BACKEND=emulate
  TRIALS=${TRIALS:-6}
  DEFAULT_EXAMPLES=$(ls examples/*_small.json 2>/dev/null | head -n 3 | tr '\n' ' ')
else
  BACKEND=cuda
  TRIALS=${TRIALS:-64}
  DEFAULT_EXAMPLES=$(ls examples/*.json 2>/dev/null | grep -v '_small\.json$' | tr '\n' ' ')
fi
SEARCH_EXAMPLES=${SEARCH_EXAMPLES:-$DEFAULT_EXAMPLES}
SEARCH_CAP_S=${SEARCH_CAP_S:-30}
SEARCH_TIMEOUT_S=${SEARCH_TIMEOUT_S:-20}
BENCH_CAP_S=${BENCH_CAP_S:-110}
GPU_TESTS_CAP_S=${GPU_TESTS_CAP_S:-60}
export STITCHTUNE_GPU_SAMPLES=${GPU_SAMPLES:-2}
export STITCHTUNE_GPU_REPORT="$WORK/gpu_schedules.jsonl"
export STITCHTUNE_CACHE="$WORK/cubin-cache"

left() { echo $(( BUDGET_S - ($(date +%s) - T_START) )); }

record() {  # name status rc seconds note
  STEPS+=("$1|$2|$3|$4|$5")
}

# step NAME CAP_S CMD...: run CMD with a timeout of min(CAP_S, time left - 20 s); log in logs/NAME.log
step() {
  local name=$1 cap=$2; shift 2
  local l; l=$(left)
  local t=$(( cap < l - 20 ? cap : l - 20 ))
  if [ "$t" -lt 5 ]; then
    record "$name" SKIP - 0 "no time left"
    return 0
  fi
  local t0; t0=$(date +%s)
  timeout --kill-after=10 "$t" "$@" >"$WORK/logs/$name.log" 2>&1
  local rc=$?
  local dt=$(( $(date +%s) - t0 ))
  local status=ok note
  note=$(grep -v '^\s*$' "$WORK/logs/$name.log" | tail -n 1 | cut -c1-70 | tr '|' '/')
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then status=TIMEOUT; note="killed after ${t}s"
  elif [ "$rc" != 0 ]; then status=FAIL; fi
  record "$name" "$status" "$rc" "$dt" "$note"
  return 0
}

# ---- setup -----------------------------------------------------------------------------------
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
[ -d "$ROOT/.gpu/pylib" ] && export PYTHONPATH="$PYTHONPATH:$ROOT/.gpu/pylib"   # e.g. a carried pytest
if [ "$DRY_RUN" = 1 ]; then
  record setup ok 0 0 "dry run: no device wheels"
else
  SETUP=""
  for c in "$ROOT/.gpu/setup.sh" "$ROOT/shared/device/setup.sh" /work/shared/device/setup.sh; do
    [ -f "$c" ] && { SETUP=$c; break; }
  done
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
  if "$PY" -c "import pycuda, optuna" >/dev/null 2>&1; then
    record setup ok 0 0 "pycuda and optuna already import"
  elif [ -n "$SETUP" ]; then
    step setup 120 bash "$SETUP"
  else
    record setup FAIL - 0 "no .gpu/setup.sh and pycuda missing"
  fi
fi

# ---- device and versions ---------------------------------------------------------------------
if [ "$DRY_RUN" = 1 ]; then
  record gpu_info SKIP - 0 "dry run: no GPU"
else
  step gpu_info 30 bash -c 'nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv && nvidia-smi'
fi
step versions 60 "$PY" -c '
import sys, subprocess, importlib
print("python", sys.version.split()[0])
for m in ("numpy", "pycuda", "optuna", "pytest", "torch", "jax"):
    try:
        mod = importlib.import_module(m); print(m, getattr(mod, "__version__", getattr(mod, "VERSION", "?")))
    except Exception as e:
        print(m, "missing:", type(e).__name__)
from stitchtune.cuda_runner import cuda_available
from stitchtune.build import find_nvcc, nvcc_version
print("nvcc", nvcc_version(find_nvcc()))
print("cuda_available", cuda_available())
'

# ---- GPU tests -------------------------------------------------------------------------------
SMOKE='
import json, sys, time, numpy as np
from types import SimpleNamespace as NS
from stitchtune.build import NvccBuilder
from stitchtune.cuda_runner import CudaRunner
N = 1 << 20
src = open("tests/test_gpu.py").read().split("KERNELS = r\"\"\"")[1].split("\"\"\"")[0]
(b,) = NvccBuilder().build([src], "sm_90")
assert b.status == "ok", b.error
def prog(k, smem=0):
    return NS(buffers=(NS(name="x", dtype="float32", size=N, role="input", tensor="x", zero_init=False),
                       NS(name="y", dtype="float32", size=N, role="output", tensor="y", zero_init=False)),
              launches=(NS(kernel=k, grid=N // 256, block=256, smem_bytes=smem, args=("x", "y")),))
x = np.random.default_rng(0).standard_normal(N).astype(np.float32)
want = {"scale2": "ok", "bad_address": "launch_error", "spin": "timeout", "smem_big": "ok"}
bad = 0
with CudaRunner.for_arrays({"x": x}, {"x": "float32"}, {"y": 2.0 * x.astype(np.float64)}, {"y": "float32"},
                           repeats=10, warmup=2, timeout_s=5.0) as r:
    for k in ("scale2", "bad_address", "scale2", "spin", "scale2", "smem_big"):
        t0 = time.time()
        (m,) = r.run([(prog(k, 65536 if k == "smem_big" else 0), b)])
        print(json.dumps({"kernel": k, "status": m.status, "median_us": m.median_us, "error": m.error[:200],
                          "wall_s": round(time.time() - t0, 2)}))
        bad += m.status != want[k]
    print("device", r.device_info, "restarts", r.restarts)
print("smoke mismatches:", bad)
sys.exit(1 if bad else 0)
'
if [ "$DRY_RUN" = 1 ]; then
  step gpu_tests "$GPU_TESTS_CAP_S" "$PY" -m pytest -q -rs -p no:cacheprovider tests/test_gpu.py \
    tests/test_runners.py -k "gpu or cuda_runner or pycuda" --junitxml="$WORK/gpu_tests.xml"
elif "$PY" -c "import pytest" >/dev/null 2>&1; then
  step gpu_tests "$GPU_TESTS_CAP_S" "$PY" -m pytest -q -rs -p no:cacheprovider -m gpu tests/test_gpu.py \
    tests/test_emulator.py tests/test_api.py --junitxml="$WORK/gpu_tests.xml"
else
  step gpu_smoke 120 "$PY" -c "$SMOKE"
fi

# ---- searches and bench ---------------------------------------------------------------------------
DB="$WORK/db"
for ex in $SEARCH_EXAMPLES; do
  name=$(basename "$ex" .json)
  step "search_$name" "$SEARCH_CAP_S" "$PY" -m stitchtune search "$ex" --backend "$BACKEND" \
    --trials "$TRIALS" --db "$DB" --seed 0 --timeout "$SEARCH_TIMEOUT_S" --jobs 8 --no-progress
done
if [ "$DRY_RUN" = 1 ]; then
  step bench 60 "$PY" -m stitchtune bench $SEARCH_EXAMPLES --db "$DB" -o "$WORK/bench" --iters 5 --warmup 1 \
    --peers eager
else
  # peers that compile fast first (every workload), then torch.compile max-autotune with the time left
  step bench "$BENCH_CAP_S" "$PY" -m stitchtune bench $SEARCH_EXAMPLES --db "$DB" -o "$WORK/bench" \
    --peers eager,xla,inductor --iters 100 --warmup 10
  step torch_entry 40 "$PY" scripts/gpu_torch_entry.py --db "$DB" --examples layernorm,softmax --iters 50
  step bench_max $(( $(left) - 30 )) "$PY" -m stitchtune bench $SEARCH_EXAMPLES --db "$DB" -o "$WORK/bench_max" \
    --peers inductor-max --iters 100 --warmup 10
fi

# ---- bundle into $OUT (at most 5 files) --------------------------------------------------------
TOTAL=$(( $(date +%s) - T_START ))
{
  echo "gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) dry_run=$DRY_RUN backend=$BACKEND total=${TOTAL}s host=$(hostname)"
  printf '%-34s %-8s %4s %6s  %s\n' step status rc secs note
  for s in "${STEPS[@]}"; do
    IFS='|' read -r n st rc secs note <<<"$s"
    printf '%-34s %-8s %4s %6s  %s\n' "$n" "$st" "$rc" "$secs" "$note"
  done
  if [ -s "$STITCHTUNE_GPU_REPORT" ]; then
    echo
    echo "schedules run on the GPU by gpu_tests (status: count):"
    "$PY" -c '
import json, sys, collections
rows = [json.loads(l) for l in open(sys.argv[1])]
c = collections.Counter((r["example"], r["status"]) for r in rows)
for (ex, st), n in sorted(c.items()):
    print(f"  {ex:28s} {st:13s} {n}")
' "$STITCHTUNE_GPU_REPORT"
  fi
} >"$WORK/summary.txt" 2>&1
rm -rf "$STITCHTUNE_CACHE"
cp "$WORK/summary.txt" "$OUT/summary.txt"
[ -s "$STITCHTUNE_GPU_REPORT" ] && cp "$STITCHTUNE_GPU_REPORT" "$OUT/gpu_schedules.jsonl"
[ -f "$WORK/gpu_tests.xml" ] && cp "$WORK/gpu_tests.xml" "$OUT/gpu_tests.xml"
tar -czf "$OUT/gpu_check_bundle.tar.gz" -C "$WORK" . 2>/dev/null
rm -rf "$WORK"
cat "$OUT/summary.txt"
echo "files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
