#!/usr/bin/env bash
# The one script the lead runs on a lent GPU machine (one H200, a few minutes of device time).
#
#   GPU machine:  bash scripts/gpu_check.sh                 # results + logs land in $OUT
#   CPU dry run:  DRY_RUN=1 OUT=/tmp/gpucheck bash scripts/gpu_check.sh
#
# Steps (each under `timeout`, the whole script within BUDGET_S seconds, default 470 = under 8 minutes;
# "plan" is the expected time on the H200 host, 16 cores):
#   setup       install the device wheels (.gpu/setup.sh) unless cuda-python + optuna import  plan ~5 s
#   gpu_info    nvidia-smi (DRY_RUN: skipped)                                                       ~1 s
#   versions    python / numpy / cuda-bindings / optuna / torch / jax versions (package metadata, no
#               imports of torch or jax) / nvcc                                                     ~3 s
#   launch_path scripts/gpu_launch_check.py, cap LAUNCH_CAP_S=45: the launch path itself (offset views,
#               a second GPU where present, capture after a warm-up, a cooperative grid-barrier
#               kernel under a concurrent load). If it fails, NOTHING ELSE RUNS: the summary says
#               "verdict: launch path FAILED" and the script exits 1 (searches on a broken launch
#               path would measure nothing). DRY_RUN: the stub-driver tests, cap 150 s
#               (tests/gpu/test_stub_driver.py: the real cuda-python binding over a stub libcuda)  ~20 s
#   gpu_tests   pytest -m gpu tests/gpu/test_gpu.py test_device_query.py hardware/test_occupancy.py
#               tests/emulate/test_emulator.py, cap 60 s   ~35-45 s
#               (fault -> launch_error, hang -> timeout, >48K smem, the launch path on torch streams
#               and in a CUDA graph, emulator vs GPU on hand-built
#               kernels, and the heuristic + GPU_SAMPLES=1 sampled schedule of the GPU_EXAMPLES
#               full-size examples vs the reference; one JSON line per program in gpu_schedules.jsonl).
#               test_api.py's GPU tests are left to torch_entry (same entry points). Without pytest
#               on the machine: an inline smoke test (cuda-python worker) of the same fault/hang/ok cases.
#               DRY_RUN: the fake-GPU and fake-driver worker tests of tests/gpu/test_runners.py.
#   search_*    `stitchtune search` per example, smallest first, TRIALS=64 trials each (cuda backend,
#               batches of 8; DRY_RUN: emulate, small examples, 6 trials). The searches share
#               SEARCH_BUDGET_S=210 s: each gets --timeout (budget left / searches left) - 8 s and a
#               cap 10 s above its share, so time a quick search leaves goes to the larger ones
#               (plan: ~15 s for a 64 MiB example, ~25-30 s for a 256 MiB one, ~170 s in all; a
#               search that runs out of time stops after its batch in flight, "stopped: timeout").
#   variant_pairs  scripts/variant_pairs.py on the searches' database (CPU, reads only)               ~3 s
#   bench       `stitchtune bench` on the examples searched: eager, XLA, Inductor, cap BENCH_CAP_S=110
#               (DRY_RUN: eager only; fails without cuda-python)                                    ~90 s
#   torch_entry scripts/gpu_torch_entry.py: stitchtune.compile (numpy and torch-tensor inputs) on the
#               small examples and
#               stitchtune.deploy.torch_entry.compile next to eager and torch.compile, cap 40                   ~35 s
#   generic     scripts/generic_vs_specialised.py --measure on layernorm_seq and embed_add_layernorm_seq
#               at seq 17 and 1537: the generic kernel of each bucket (extents as kernel arguments) and
#               the specialised kernel of each extent, built and timed (CUDA events), both checked
#               against the reference, next to the cost model's predictions, cap 30 s (DRY_RUN: the
#               predictions only)                                                                    ~20 s
#   bench_max   torch.compile max-autotune-no-cudagraphs with the time left (plan ~60-90 s; nothing
#               if every step before ran to its cap: 5+1+3+60+220+3+110+40+30 = 472 s)
# Then everything is bundled into $OUT (at most 4 files) and a short table is printed last.
# Why 64 trials of all 8 full-size examples should fit (not yet run on a GPU): on a 2-core CPU with the
# fake GPU (scripts/profile_host_overhead.py, fake builds) a 64-trial search of bias_gelu (256 MiB
# output, all 64 candidates measured) costs the host 22 s, softmax 10 s, layernorm 3.4 s (they were
# 36 / 33 / 8.7 s before the worker mapped its problem instead of receiving it through the socket);
# a worker (re)start is 0.1 s instead of 2 s. On the H200 host add nvcc (~0.7-1 s per batch of 8
# with 16 cores, session-1 compile_s) and ~4 s of start-up per search: ~15-30 s per search.
#
# Knobs: DRY_RUN, OUT, BUDGET_S, LAUNCH_CAP_S, TRIALS, SEARCH_EXAMPLES (space-separated paths, run in that order),
# SEARCH_BUDGET_S (all searches together), SEARCH_TIMEOUT_S (a fixed --timeout per search instead of
# the shares; its cap is then SEARCH_CAP_S, default timeout + 10), GPU_SAMPLES (default 1),
# GPU_EXAMPLES (comma-separated full-size examples for gpu_tests, default
# layernorm_bf16,colsum_sigmoid_scale: bf16 and the column family; "all" for every one),
# GPU_TESTS_CAP_S (60), BENCH_CAP_S (110: session 1 took 87 s; the primary result, so not squeezed).
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

# examples smallest first (input bytes), so that the time a quick search leaves goes to the larger ones
by_size() {
  "$PY" -c '
import json, sys
def size(p):
    d = json.load(open(p)); n = 0
    for t in list(d.get("inputs", {}).values()):
        k = 1
        for x in t["shape"]: k *= x
        n += k * (4 if t.get("dtype", "float32") == "float32" else 2)
    return n
print(" ".join(sorted(sys.argv[1:], key=lambda p: (size(p), p))))
' "$@" 2>/dev/null || echo "$@"
}
if [ "$DRY_RUN" = 1 ]; then
  BACKEND=emulate
  TRIALS=${TRIALS:-6}
  DEFAULT_EXAMPLES=$(ls examples/*_small.json 2>/dev/null | head -n 3 | tr '\n' ' ')
  SEARCH_BUDGET_S=${SEARCH_BUDGET_S:-120}
else
  BACKEND=cuda
  TRIALS=${TRIALS:-64}
  DEFAULT_EXAMPLES=$(by_size $(ls examples/*.json 2>/dev/null | grep -v '_small\.json$'))
  SEARCH_BUDGET_S=${SEARCH_BUDGET_S:-210}
fi
SEARCH_EXAMPLES=${SEARCH_EXAMPLES:-$DEFAULT_EXAMPLES}
SEARCH_TIMEOUT_S=${SEARCH_TIMEOUT_S:-}
SEARCH_CAP_S=${SEARCH_CAP_S:-$(( ${SEARCH_TIMEOUT_S:-0} + 10 ))}
BENCH_CAP_S=${BENCH_CAP_S:-110}
GPU_TESTS_CAP_S=${GPU_TESTS_CAP_S:-60}
LAUNCH_CAP_S=${LAUNCH_CAP_S:-$([ "$DRY_RUN" = 1 ] && echo 150 || echo 45)}
LAUNCH_OK=1
export STITCHTUNE_GPU_SAMPLES=${GPU_SAMPLES:-1}
GPU_EXAMPLES=${GPU_EXAMPLES:-layernorm_bf16,colsum_sigmoid_scale}
[ "$GPU_EXAMPLES" = all ] && GPU_EXAMPLES=""
export STITCHTUNE_GPU_EXAMPLES=$GPU_EXAMPLES
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
  if "$PY" -c "from stitchtune.gpu.driver import _binding; _binding(); import optuna" >/dev/null 2>&1; then
    record setup ok 0 0 "cuda-python and optuna already import"
  elif [ -n "$SETUP" ]; then
    step setup 120 bash "$SETUP"
  else
    record setup FAIL - 0 "no .gpu/setup.sh and cuda-python missing"
  fi
fi

# ---- device and versions ---------------------------------------------------------------------
if [ "$DRY_RUN" = 1 ]; then
  record gpu_info SKIP - 0 "dry run: no GPU"
else
  step gpu_info 30 bash -c 'nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv && nvidia-smi'
fi
step versions 60 "$PY" -c '
import sys, importlib.metadata as md
print("python", sys.version.split()[0])
for m in ("numpy", "cuda-bindings", "cuda-python", "optuna", "pytest", "torch", "jax"):
    try:
        print(m, md.version(m))   # package metadata: importing torch or jax here would cost seconds
    except Exception as e:
        print(m, "missing:", type(e).__name__)
from stitchtune.gpu.runner import cuda_available
from stitchtune.gpu.build import find_nvcc, nvcc_version
print("nvcc", nvcc_version(find_nvcc()))
print("cuda_available", cuda_available())
'

# ---- the launch path first: stop with a verdict when it fails ------------------------------------
if [ "$DRY_RUN" = 1 ]; then
  step launch_path "$LAUNCH_CAP_S" "$PY" -m pytest -q -rs -p no:cacheprovider tests/gpu/test_stub_driver.py
else
  step launch_path "$LAUNCH_CAP_S" "$PY" scripts/gpu_launch_check.py
fi
case "${STEPS[$(( ${#STEPS[@]} - 1 ))]}" in
  launch_path\|ok\|*) ;;
  *) LAUNCH_OK=0 ;;
esac

if [ "$LAUNCH_OK" = 1 ]; then
# ---- GPU tests -------------------------------------------------------------------------------
SMOKE='
import json, sys, time, numpy as np
from types import SimpleNamespace as NS
from stitchtune.gpu.build import NvccBuilder
from stitchtune.gpu.runner import CudaRunner
N = 1 << 20
src = open("tests/gpu/test_gpu.py").read().split("KERNELS = r\"\"\"")[1].split("\"\"\"")[0]
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
  step gpu_tests "$GPU_TESTS_CAP_S" "$PY" -m pytest -q -rs -p no:cacheprovider tests/gpu/test_gpu.py \
    tests/gpu/test_runners.py tests/gpu/test_launch.py -k "gpu or cuda_runner or driver or worker or launch" \
    --junitxml="$WORK/gpu_tests.xml"
elif "$PY" -c "import pytest" >/dev/null 2>&1; then
  step gpu_tests "$GPU_TESTS_CAP_S" "$PY" -m pytest -q -rs -p no:cacheprovider -m gpu tests/gpu/test_gpu.py \
    tests/gpu/test_device_query.py tests/hardware/test_occupancy.py tests/emulate/test_emulator.py \
    --junitxml="$WORK/gpu_tests.xml"
else
  step gpu_smoke 120 "$PY" -c "$SMOKE"
fi

# ---- searches and bench ---------------------------------------------------------------------------
DB="$WORK/db"
n_left=$(echo $SEARCH_EXAMPLES | wc -w)
searches_t0=$(date +%s)
for ex in $SEARCH_EXAMPLES; do
  name=$(basename "$ex" .json)
  if [ -n "$SEARCH_TIMEOUT_S" ]; then
    to=$SEARCH_TIMEOUT_S cap=$SEARCH_CAP_S
  else  # an equal share of the search budget still left; 8 s of it for start-up and the batch in flight
    share=$(( (SEARCH_BUDGET_S - ($(date +%s) - searches_t0)) / n_left ))
    to=$(( share - 8 < 5 ? 5 : share - 8 )) cap=$(( share + 10 ))
  fi
  step "search_$name" "$cap" "$PY" -m stitchtune search "$ex" --backend "$BACKEND" \
    --trials "$TRIALS" --db "$DB" --seed 0 --timeout "$to" --jobs 8 --no-progress
  # note: trials, why it stopped, best time (instead of the log's last line)
  log="$WORK/logs/search_$name.log"
  if grep -q 'trial(s) this run' "$log" 2>/dev/null; then
    i=$(( ${#STEPS[@]} - 1 ))
    IFS='|' read -r n st rc secs _ <<<"${STEPS[$i]}"
    tr_n=$(grep -oE '[0-9]+ trial\(s\) this run' "$log" | head -n 1 | cut -d' ' -f1)
    why=$(grep -oE 'stopped: [a-z_]+' "$log" | head -n 1 | cut -d' ' -f2)
    best=$(grep -E '^ +best time' "$log" | head -n 1 | awk '{print $3 $4}')
    STEPS[$i]="$n|$st|$rc|$secs|$tr_n trials (timeout ${to}s), stopped: $why, best $best"
  fi
  n_left=$(( n_left - 1 ))
done
# pairs of schedules that differ in one option (every search measures its best point's variants)
[ -f scripts/variant_pairs.py ] && step variant_pairs 30 "$PY" scripts/variant_pairs.py --db "$DB" --backend "$BACKEND"
if [ "$DRY_RUN" = 1 ]; then
  step generic 30 "$PY" scripts/generic_vs_specialised.py --examples layernorm_seq,embed_add_layernorm_seq \
    --extents 17,1537
  step bench 60 "$PY" -m stitchtune bench $SEARCH_EXAMPLES --db "$DB" -o "$WORK/bench" --iters 5 --warmup 1 \
    --peers eager
else
  # peers that compile fast first (every workload), then torch.compile max-autotune with the time left
  step bench "$BENCH_CAP_S" "$PY" -m stitchtune bench $SEARCH_EXAMPLES --db "$DB" -o "$WORK/bench" \
    --peers eager,xla,inductor --iters 100 --warmup 10
  step torch_entry 40 "$PY" scripts/gpu_torch_entry.py --db "$DB" --examples layernorm,softmax --iters 50
  # generic (one kernel per bucket, extents as kernel arguments) vs specialised kernels: predicted and measured
  step generic 30 "$PY" scripts/generic_vs_specialised.py --measure --examples layernorm_seq,embed_add_layernorm_seq \
    --extents 17,1537 --iters 50
  step bench_max $(( $(left) - 30 )) "$PY" -m stitchtune bench $SEARCH_EXAMPLES --db "$DB" -o "$WORK/bench_max" \
    --peers inductor-max --iters 100 --warmup 10
fi
fi  # LAUNCH_OK

# ---- bundle into $OUT (at most 4 files) --------------------------------------------------------
TOTAL=$(( $(date +%s) - T_START ))
{
  echo "gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) dry_run=$DRY_RUN backend=$BACKEND total=${TOTAL}s host=$(hostname)"
  if [ "$LAUNCH_OK" = 1 ]; then
    echo "verdict: launch path ok"
  else
    echo "verdict: launch path FAILED -- nothing else was run (see logs/launch_path.log in the bundle):"
    grep -E '^check |^launch path|passed|failed|error' "$WORK/logs/launch_path.log" 2>/dev/null | tail -n 8 | sed 's/^/  /'
  fi
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
[ "$LAUNCH_OK" = 1 ] || exit 1
