#!/usr/bin/env bash
# The GPU round of the whole-model backend (issue 26), one call on a lent H200:
#
#   GPU machine:  bash .gpu/setup.sh && export PYTHONPATH=$PWD:/tmp/site && bash scripts/gpu_round.sh
#   CPU dry run:  DRY_RUN=1 OUT=/tmp/gpu_round bash scripts/gpu_round.sh
#
# Steps, in order of importance, sharing BUDGET_S seconds (default 470); every step's rows land in
# $OUT as they are made, so a cut-short run keeps what finished:
#   1. gpu_info      nvidia-smi
#   2. launch_check  scripts/gpu_launch_check.py (the launch path itself), cap 60 s
#   3. check_six     scripts/gpu_models.py --phases check on BERT, GPT-2, Llama, ViT, ConvNeXt, ResNet
#                    (inference + a training step under the backend vs eager, real cubins)
#   4. time          --phases time: BERT, Llama, GPT-2 at 2 layers x hidden 768/1024, batch 8 x 512:
#                    eager / Inductor / backend, median us per step (CUDA events) + CUDA kernels per step
#   5. check_rest    --phases check on the rest of the matrix (Qwen2, DistilBERT, T5, Whisper, Swin, Phi-3)
# DRY_RUN=1: steps 3 and 5 on the CPU (emulated regions, two models), nothing else.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_round}
BUDGET_S=${BUDGET_S:-470}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
T0=$(date +%s)
left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }
export STITCHTUNE_CACHE=${STITCHTUNE_CACHE:-/tmp/stitchtune-cubins} PYTHONUNBUFFERED=1
MODELS="$PY scripts/gpu_models.py --out $OUT"
if [ "${DRY_RUN:-0}" = 1 ]; then
  $MODELS --cpu --phases check --models bert,resnet --budget-s "$(left)" > "$OUT/check.log" 2>&1; echo "check rc=$?"
  tail -6 "$OUT/gpu_models.md"; exit 0
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > "$OUT/gpu_info.txt" 2>&1
cat "$OUT/gpu_info.txt"
timeout 60 $PY scripts/gpu_launch_check.py > "$OUT/launch_check.log" 2>&1; echo "launch_check rc=$?"
grep -E "^check |launch path" "$OUT/launch_check.log"
timeout $(( $(left) - 10 )) $MODELS --phases check --models bert,gpt2,llama,vit,convnext,resnet \
  --budget-s 140 > "$OUT/check_six.log" 2>&1; echo "check_six rc=$? left=$(left)"
timeout $(( $(left) - 10 )) $MODELS --phases time --time-models bert,llama,gpt2 \
  --budget-s $(( $(left) - 120 )) > "$OUT/time.log" 2>&1; echo "time rc=$? left=$(left)"
timeout $(( $(left) - 5 )) $MODELS --phases check --models qwen2,distilbert,t5,whisper,swin,phi3 \
  --budget-s $(( $(left) - 45 )) > "$OUT/check_rest.log" 2>&1; echo "check_rest rc=$? left=$(left)"
cat "$OUT/gpu_models.md"
grep -h '"exception"\|"error": "' "$OUT"/*.log | cut -c1-400 | head -20
