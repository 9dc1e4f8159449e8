#!/usr/bin/env bash
# The GPU round of issue 44, one command on a lent H100/H200 (docs/gpu-round.md):
#
#   GPU machine:  bash scripts/gpu_round.sh                      # BUDGET_S=540: one 600 s call
#   second call:  RESUME=.gpu/round.tar.gz PHASES=decode,peers,refit bash scripts/gpu_round.sh  # what the first left
#   CPU dry run:  DRY_RUN=1 OUT=/tmp/round bash scripts/gpu_round.sh   # tiny models, emulated regions
#   CPU check:    CHECK=1 OUT=/tmp/round bash scripts/gpu_round.sh     # every phase's GPU command line, not run
#
# Phases, most valuable first; each runs under `timeout` with min(its share, budget left - 15 s) and its
# Python side stops starting new jobs 15 s before its share ends (half-way for shares under 45 s). Every row is written as it is
# measured, and after every phase the results folder is packed again, so a run cut short keeps what
# finished. Shares (s) for the default BUDGET_S=540; a phase with < 10 s left is SKIP:
#   setup    15  the device wheels (pycuda, optuna: .gpu/setup.sh) unless they import already
#   info     20  nvidia-smi, versions, git commit
#   launch   45  scripts/gpu_launch_check.py; if it fails no stitched phase runs (they would measure nothing)
#   check    70  gpu_models.py --phases check on bert,gpt2,llama,vit,convnext,resnet (inference + train)
#   regions 140  gpu_step.py --phases regions: BERT/GPT-2/Llama, 2 layers, batch 8x512, bf16 then fp32,
#                inference then train: per region ours vs Inductor (CUPTI), floor + fitted model (predicted)
#   steps   150  gpu_step.py --phases steps: eager / inductor / inductor-ro / stitchtune / stitchtune+cg
#   tuned    70  gpu_models.py --phases tuned: `stitchtune tune` on BERT inference (TUNE_TRIALS=24), timed
#   decode   60  gpu_step.py --phases decode: batch-1 KV-cache decode, tiny GPT-2 and Llama
#   peers    60  gpu_peers.py: F.layer_norm / rms_norm / softmax / cross_entropy (+ Liger/QuACK) on the
#                full-size examples and at 8 rows (launch-bound), CUDA events and CUDA-graph replay
#   experiments 240  gpu_experiments.py (L2 residency, latency sweep, schedule A/B, scatter variants) then
#                gpu_experiments_fit.py: the fits (results/<device>-<date>/experiments/); its own call is best:
#                PHASES=setup,info,launch,experiments BUDGET_S=300 (docs/gpu-round.md)
#   refit    30  gpu_fit_rows.py refit: the cost model fitted again with the round's per-kernel rows
# RESUME=<a first call's round.tar.gz, carried>: unpack it first and append to its rows (one folder for both calls).
# CHECK=1: every phase's command line as a GPU call runs it, checked on any machine without running it: the
# shell syntax of each (bash -n); setup and info only so (they call the GPU machine's tools); the Python
# scripts under GPU_ROUND_CHECK=1 parse and validate their options, print '<script>: options ok' and exit 0
# (gpu_timing.options_only); a bad option is the phase's FAIL (rc 2). Nothing is measured: the pack holds logs.
# Knobs: BUDGET_S, PHASES (comma list), OUT, PYTHON, MODELS (bert,gpt2,llama), DTYPES (bf16,fp32),
# MODES (inference,train), ITERS (20), TUNE_TRIALS (24), SHARE_<PHASE> (seconds, e.g. SHARE_STEPS=200).
# $OUT gets 3 files: summary.md (phase times, headline ratios by scripts/gpu_round_report.py, every table),
# round.tar.gz (results/<device>-<date>/: jsonl rows, tables, logs) and round.log (this script's output).
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
DRY_RUN=${DRY_RUN:-0}
CHECK=${CHECK:-0}
[ "$CHECK" = 1 ] && DRY_RUN=0   # the GPU command lines are the ones checked
OUT=${OUT:-/tmp/gpu_round}
BUDGET_S=${BUDGET_S:-540}
PY=${PYTHON:-python3}
PHASES=${PHASES:-setup,info,launch,check,regions,steps,tuned,decode,peers,experiments,refit}
MODELS=${MODELS:-bert,gpt2,llama}
DTYPES=${DTYPES:-bf16,fp32}
MODES=${MODES:-inference,train}
ITERS=${ITERS:-20}
TUNE_TRIALS=${TUNE_TRIALS:-24}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/round.log") 2>&1
T0=$(date +%s)
left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }
export STITCHTUNE_CACHE=${STITCHTUNE_CACHE:-/tmp/stitchtune-cubins} PYTHONUNBUFFERED=1
export PYTHONPATH="$ROOT:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"

if [ "$DRY_RUN" = 1 ]; then
  DEV=cpu-dryrun
elif [ "$CHECK" = 1 ]; then
  DEV=cpu-check
else
  DEV=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | grep -oiE 'h100|h200|b200|a100|l40s' \
        | head -n 1 | tr 'A-Z' 'a-z')
  DEV=${DEV:-gpu}
fi
NAME="$DEV-$(date -u +%Y-%m-%d)"
WORK=${WORK:-$(mktemp -d /tmp/gpu_round_work.XXXXXX)}
mkdir -p "$WORK"
if [ -n "${RESUME:-}" ]; then   # a first call's round.tar.gz: its rows are kept and this call's appended
  if [ ! -f "$RESUME" ]; then echo "gpu_round: error: RESUME=$RESUME is not a file" >&2; exit 2; fi
  NAME=$(tar tzf "$RESUME" | head -n 1 | cut -d/ -f1)
  tar xzf "$RESUME" -C "$WORK" || { echo "gpu_round: error: cannot unpack RESUME=$RESUME" >&2; exit 2; }
  [ -f "$WORK/$NAME/summary.md" ] && mv "$WORK/$NAME/summary.md" "$WORK/$NAME/summary-$(date -u +%H%M%S)-before.md"
fi
RES="$WORK/$NAME"
mkdir -p "$RES/logs"
ROWS=()   # "phase|status|rc|seconds|share"
LAUNCH_OK=1

summary() {
  {
    echo "# GPU round (issue 44): $NAME"
    echo
    echo "commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), budget ${BUDGET_S} s, phases $PHASES," \
         "$( [ "$DRY_RUN" = 1 ] && echo 'DRY RUN on the CPU: every time is CPU wall clock of tiny models, no GPU figure' \
             || { [ "$CHECK" = 1 ] && echo 'CHECK: command lines checked, nothing run or measured'; } \
             || echo 'times measured on this GPU unless a column says predicted')"
    echo
    echo "| phase | status | rc | seconds | share s |"
    echo "|---|---|---|---|---|"
    local r
    for r in "${ROWS[@]}"; do echo "| ${r//|/ | } |"; done
    if "$PY" scripts/gpu_round_report.py "$RES" > "$RES/headline.md" 2>/dev/null && [ -s "$RES/headline.md" ]; then
      echo; echo "## Headline (scripts/gpu_round_report.py)"; echo; cat "$RES/headline.md"
    fi
    local n; n=$(cat "$RES"/*.jsonl 2>/dev/null | grep -c '"skipped": "budget spent"')
    [ "$n" -gt 0 ] && { echo; echo "Jobs not reached (their phase's share ran out): $n;" \
      "rerun them with PHASES=... and MODELS/DTYPES/MODES:"; cat "$RES"/*.jsonl | grep '"skipped": "budget spent"' \
      | sed -E 's/.*"phase": "([a-z]+)", "model": "([a-z0-9]+)"(, "dtype": "([a-z0-9]+)")?(, "mode": "([a-z]+)")?.*/- \1 \2 \4 \6/' \
      | sort -u; }
    for f in gpu_info.txt; do [ -f "$RES/$f" ] && { echo; echo '```'; cat "$RES/$f"; echo '```'; }; done
    for f in gpu_models.md gpu_step.md gpu_peers.md experiments/experiments.md experiments/fits.md refit.md fit/fit.md; do
      [ -s "$RES/$f" ] && { echo; echo "## $f"; echo; head -n 400 "$RES/$f"; }
    done
    echo
    echo "Unpack here: mkdir -p results && tar xzf round.tar.gz -C results  # -> results/$NAME/"
  } > "$RES/summary.md"
  cp "$RES/summary.md" "$OUT/summary.md"
  tar czf "$OUT/round.tar.gz.part" -C "$WORK" "$NAME" && mv "$OUT/round.tar.gz.part" "$OUT/round.tar.gz"
}

# phase NAME DEFAULT_SHARE CMD...: CMD (which may read $SHARE, the seconds it gets) under timeout
phase() {
  local name=$1 share=$2; shift 2
  case ",$PHASES," in *",$name,"*) ;; *) return 0 ;; esac
  local var; var="SHARE_$(echo "$name" | tr 'a-z' 'A-Z')"
  share=${!var:-$share}
  local l; l=$(( $(left) - 15 ))
  export SHARE=$(( share < l ? share : l ))
  if [ "$SHARE" -lt 10 ]; then
    ROWS+=("$name|SKIP|-|0|$share"); echo "== $name: SKIP (no time left)"; summary; return 0
  fi
  echo "== $name: up to $SHARE s (budget left $(left) s)"
  local t0; t0=$(date +%s) run=$*
  if [ "$CHECK" = 1 ]; then   # the command line checked, not run (see CHECK above)
    if ! bash -n -c "$*" 2> "$RES/logs/$name.syntax"; then
      run="cat $RES/logs/$name.syntax; echo 'shell syntax error in: $name'; exit 2"
    elif [ "$name" = setup ] || [ "$name" = info ]; then
      run="echo 'shell syntax ok (not run: it needs the GPU machine)'"
    fi
  fi
  GPU_ROUND_CHECK=$CHECK timeout --kill-after=5 "$SHARE" bash -c "$run" > "$RES/logs/$name.log" 2>&1
  local rc=$?
  local dt=$(( $(date +%s) - t0 )) st=ok
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then st=TIMEOUT; elif [ "$rc" != 0 ]; then st=FAIL; fi
  ROWS+=("$name|$st|$rc|$dt|$share")
  echo "== $name: $st rc=$rc ${dt}s"
  tail -n 3 "$RES/logs/$name.log"
  summary
  return "$rc"
}

CPU=""; [ "$DRY_RUN" = 1 ] && CPU="--cpu"
STEP="$PY scripts/gpu_step.py --out $RES $CPU --iters $ITERS"
GM="$PY scripts/gpu_models.py --out $RES $CPU --iters $ITERS"
if [ "$DRY_RUN" = 1 ]; then   # tiny and short: this tests the orchestration, nothing is measured
  CHECK_MODELS=bert; MODES=${DRY_MODES:-inference}; MODELS=${DRY_MODELS:-bert}; DTYPES=${DRY_DTYPES:-fp32}
  PEER_ARGS="--dtypes fp32 --ops layer_norm --sizes full --iters 2"; DECODE_ARGS="--decode-steps 2 --prompt 4 --decode-models gpt2"
else
  CHECK_MODELS=bert,gpt2,llama,vit,convnext,resnet
  PEER_ARGS="--dtypes fp32,bf16 --iters 50"; DECODE_ARGS="--decode-steps 32 --prompt 32"
fi

if [ "$DRY_RUN" = 1 ]; then
  phase setup 15 'echo "dry run: no device wheels"'
  phase info 20 "$PY -c 'import sys, torch; print(\"python\", sys.version.split()[0], \"torch\", torch.__version__)'"
  phase launch 45 'echo "dry run: the launch path needs a GPU"'
else
  phase setup 15 "$PY -c 'from stitchtune.gpu.driver import _binding; _binding(); import optuna' 2>/dev/null && echo ready \
    || for s in .gpu/setup.sh shared/device/setup.sh /work/shared/device/setup.sh; do [ -f \$s ] && exec bash \$s; done"
  phase info 20 "nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv \
    | tee $RES/gpu_info.txt; $PY -c 'import torch; print(\"torch\", torch.__version__)' | tee -a $RES/gpu_info.txt; nvcc --version | tail -n 2"
  phase launch 45 "$PY scripts/gpu_launch_check.py" || {
    case ",$PHASES," in *",launch,"*) LAUNCH_OK=0 ;; esac
  }
fi
if [ "$LAUNCH_OK" = 0 ]; then
  echo "verdict: launch path FAILED; no stitched phase runs (logs/launch.log)"
  ROWS+=("verdict: launch path FAILED|-|-|-|-")
  summary
  exit 1
fi
phase check 70 "$GM --phases check --models $CHECK_MODELS --modes $MODES --budget-s \$((SHARE > 45 ? SHARE - 15 : SHARE / 2))"
phase regions 140 "$STEP --phases regions --models $MODELS --dtypes $DTYPES --modes $MODES --budget-s \$((SHARE > 45 ? SHARE - 15 : SHARE / 2))"
phase steps 150 "$STEP --phases steps --models $MODELS --dtypes $DTYPES --modes $MODES --budget-s \$((SHARE > 45 ? SHARE - 15 : SHARE / 2))"
if [ "$DRY_RUN" = 1 ]; then
  phase tuned 70 'echo "dry run: tuning needs the cuda backend"'
else
  phase tuned 70 "$GM --phases tuned --tune-models bert --modes inference --trials $TUNE_TRIALS --budget-s \$((SHARE > 45 ? SHARE - 15 : SHARE / 2))"
fi
phase decode 60 "$STEP --phases decode $DECODE_ARGS --budget-s \$((SHARE > 45 ? SHARE - 15 : SHARE / 2))"
phase peers 60 "$PY scripts/gpu_peers.py --out $RES $CPU $PEER_ARGS --budget-s \$((SHARE > 45 ? SHARE - 15 : SHARE / 2))"
if [ "$DRY_RUN" = 1 ]; then
  phase experiments 240 'echo "dry run: the experiments need a GPU (CHECK=1 builds and emulates every kernel)"'
else   # under CHECK=1 gpu_experiments.py builds (nvcc, sm_90) and emulates every kernel: no options-only pass
  phase experiments 240 "$PY scripts/gpu_experiments.py --out $RES/experiments --fit-rows $RES/fit_rows.jsonl \
    --iters $ITERS --budget-s \$((SHARE > 45 ? SHARE - 15 : SHARE / 2)) && $PY scripts/gpu_experiments_fit.py $RES/experiments"
fi
phase refit 30 "$PY scripts/gpu_fit_rows.py refit $RES"
summary
echo "== done in $(( $(date +%s) - T0 )) s; $OUT: $(ls "$OUT" | tr '\n' ' ')"
