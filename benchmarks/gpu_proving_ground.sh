#!/usr/bin/env bash
# Issue 25's proving ground, then issue 26's transfer as far as time allows, in one device call on
# the GPU machine (its 16 cores and one GPU; no Ray or MLflow there, so the studies run through
# benchmarks/direct_proving_ground.py):
#   1. six 32-trial studies at 2e12 FLOPs side by side (GP, the default controller, and random
#      search, controller seeds 0-2), no trial started after STUDY_S seconds (counted once the data
#      is prepared);
#   2. their winners and sized-cpu, neobert-cpu and modernbert-cpu at 1x and 3x, 3 seeds, and
#      sized-cpu's curve to 8x, JOBS crams at once; the table;
#   3. benchmarks/transfer.py of pg-gp-s0's top 6 and the hand designs at MULTIPLES (10x with one
#      seed), until the script's LIMIT_S is spent; its crams share step 2's (the same keys).
#
#   bash benchmarks/gpu_proving_ground.sh DATA_DIR             # on the GPU machine
#   bash benchmarks/gpu_proving_ground.sh --dry-run DATA_DIR   # on a CPU: 2 studies of 3 trials, tiny budget
#
# Work goes to .gpurun/ (kept on a warm machine, so a second call resumes every stage), and is
# copied to $OUT at the end. PYTHON names the interpreter (default python3).
set -uo pipefail
cd "$(dirname "$0")/.."
dry=0
if [ "${1:-}" = --dry-run ]; then dry=1; shift; fi
data="$(realpath "${1:?usage: gpu_proving_ground.sh [--dry-run] DATA_DIR}")"
out="${OUT:-$(mktemp -d)}"
py="${PYTHON:-python3}"
work="$PWD/.gpurun"
mkdir -p "$work" "$out"
export CRAMNAS_CACHE="$work/cache" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
log="$work/gpu_proving_ground.log"
start=$SECONDS
left() { echo $((LIMIT_S - (SECONDS - start))); }

studies=gp:0,gp:1,gp:2,random:0,random:1,random:2 trials=32 budget=2e12flops multiples=1,3,10 seeds_at=10x=1
LIMIT_S="${LIMIT_S:-480}" STUDY_S="${STUDY_S:-200}" JOBS="${JOBS:-12}"
if [ "$dry" = 1 ]; then studies=gp:0,random:0 trials=3 budget=2e10flops multiples=1,3 seeds_at=3x=1 JOBS=2; fi

if [ "$dry" = 0 ] && compgen -G ".whl/*.whl" >/dev/null; then  # the packages the image lacks (benchmarks/gpu_wheels.sh)
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        2>&1 | tee -a "$log" || { echo "error: installing .whl/ failed"; exit 1; }
    export PYTHONPATH="/tmp/site:$PWD"
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
{ command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; lscpu | grep "Model name"
  "$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"; } 2>&1 | tee -a "$log"

pg=("$py" benchmarks/direct_proving_ground.py --data "$data" --studies "$studies" --trials "$trials"
    --budget "$budget" --jobs "$JOBS" --out "$work/pg")
echo "=== studies (no trial starts after ${STUDY_S}s) ===" | tee -a "$log"
timeout "$(left)" "${pg[@]}" --stages studies --deadline-s "$STUDY_S" 2>&1 | tee -a "$log"
echo "=== confirmations ($(left)s left) ===" | tee -a "$log"
timeout "$(left)" "${pg[@]}" --stages confirm --curve "${CURVE:-1,2,3,4,8}" 2>&1 | tee -a "$log"
if [ "$(left)" -gt 20 ]; then
    echo "=== transfer ($(left)s left) ===" | tee -a "$log"
    timeout "$(left)" "$py" benchmarks/transfer.py --data "$data" --study pg-gp-s0 \
        --storage "sqlite:///$work/pg/pg-gp-s0.db" --budget "$budget" --multiples "$multiples" --seeds-at "$seeds_at" \
        --baselines sized-cpu,neobert-cpu,modernbert-cpu,crammed-bert-cpu --jobs "$JOBS" --out "$work/pg" 2>&1 | tee -a "$log"
fi
echo "=== done after $((SECONDS - start)) s ===" | tee -a "$log"
cp "$log" "$work"/pg/*.jsonl "$work"/pg/*.md "$work"/pg/*.db "$out"/ 2>/dev/null
true
