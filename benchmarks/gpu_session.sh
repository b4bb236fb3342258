#!/usr/bin/env bash
# Every GPU measurement of cramnas in one short run (about 8 minutes on an H200):
#   1. training throughput of CrammedBert against transformers' BertForMaskedLM at BERT-base size;
#   2. crammed-bert tokens/s and MFU of the trainer's own loop, eager and compiled (gpu_check.py), and
#      the host overhead of a micro-step before and after static shapes (host_overhead.py);
#   3. a real cram of crammed-bert on the data directory (the GPU profile's run config);
#   4. the GLUE probe of that checkpoint against the same architecture at random initialisation.
#
#   bash benchmarks/gpu_session.sh DATA_DIR [OUT_DIR] [CRAM_BUDGET]
#
# PYTHON names the interpreter (default python3); run from a checkout with the repository root on
# PYTHONPATH or cramnas installed.
# Each step has its own time limit, so one slow step cannot take the others' results with it; the
# whole log goes to OUT_DIR/gpu_session.log and the cram's result.json beside it.
set -uo pipefail
cd "$(dirname "$0")/.."
data="${1:?usage: gpu_session.sh DATA_DIR [OUT_DIR] [CRAM_BUDGET]}"
out="${2:-gpu-session}"
budget="${3:-100s}"
mkdir -p "$out"
py="${PYTHON:-python3}"
export CRAMNAS_CACHE="${CRAMNAS_CACHE:-/tmp/cramnas-cache}" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
log="$out/gpu_session.log"
checkpoint="$(mktemp -d)/crammed-bert"  # hundreds of MB: kept out of OUT_DIR

step() {  # step NAME SECONDS COMMAND...
    local name="$1" limit="$2"
    shift 2
    echo "=== $name (limit ${limit}s) ===" | tee -a "$log"
    local start=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee -a "$log"
    echo "=== $name: exit ${PIPESTATUS[0]} after $((SECONDS - start)) s ===" | tee -a "$log"
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; } 2>&1 | tee -a "$log"
step throughput 60 "$py" benchmarks/model_throughput.py --device cuda --layers 12 --hidden 768 --heads 12 \
    --batch 128 --steps 20
step mfu 150 "$py" benchmarks/gpu_check.py
step overhead 45 "$py" benchmarks/host_overhead.py --device cuda --config trainer/configs/crammed-bert.yaml --steps 30
step cram 170 "$py" -m trainer.cram --config trainer/configs/crammed-bert.yaml --budget "$budget" \
    --data "$data" --out "$checkpoint"
cp "$checkpoint/result.json" "$out/cram_result.json" 2>/dev/null
step probe 140 "$py" benchmarks/probe_signal.py --checkpoint "$checkpoint" --data "$data" --seeds 1 \
    --max-train-examples 8000 --max-seconds-per-task 10
