#!/usr/bin/env bash
# Every GPU measurement of cramnas in one device call of at most 8 minutes on a fresh GPU machine:
#   0. the interpreter: the image's python3 (its torch, never another), the project on PYTHONPATH,
#      and the packages the image lacks (datasets, optuna, MLflow's tracking client and their needs;
#      not Ray) installed from the wheels in .whl/ (benchmarks/gpu_wheels.sh fetches them) into /tmp/site;
#   1. a 10-second compile preflight (a C compiler, Python's headers, one tiny torch.compile): when
#      Inductor cannot compile here, the steps below run eager, and the log says so;
#   2. gpu_check.py: tokens/s and MFU of the GPU profile's own loop (micro-batches of 256, 6 per
#      step) over 100 compiled optimizer steps, against eager, one step under sync debug;
#   3. a 60-second trainer.cram of crammed-bert with the profile's batch;
#   4. a real search.run of 4 trials on the local executor (no Ray: each trial a process of its own
#      on the GPU, compiled inside the trial, its reports, its GPU peak), 10 s each, probing two GLUE tasks;
#   5. the GLUE probe of step 3's checkpoint against the same architecture at random initialisation.
#
#   bash benchmarks/gpu_session.sh DATA_DIR            # on the GPU machine (DATA_DIR: pretrain/ and glue/)
#   bash benchmarks/gpu_session.sh --dry-run DATA_DIR  # on a CPU: every step at tiny sizes, eager, in well
#                                                      # under a minute of CPU time (tests/test_gpu_session.py)
#
# Outputs go to $OUT (default: a new temporary directory): gpu_session.log (everything), cram_result.json,
# search_trials.json. PYTHON names the interpreter (default python3). Each step has its own time
# limit, so one slow step cannot take the others' results with it; the limits add up to 465 s.
set -uo pipefail
cd "$(dirname "$0")/.."
dry=0
if [ "${1:-}" = --dry-run ]; then dry=1; shift; fi
data="$(realpath "${1:?usage: gpu_session.sh [--dry-run] DATA_DIR}")"
out="${OUT:-$(mktemp -d)}"
py="${PYTHON:-python3}"
work="$(mktemp -d)"  # checkpoints, stores, derived configs: kept out of $OUT (what comes back is small)
mkdir -p "$out"
log="$out/gpu_session.log"
export CRAMNAS_CACHE="${CRAMNAS_CACHE:-$work/cache}" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 MLFLOW_TRACKING_URI="sqlite:///$work/mlflow.db"
say() { echo "$*" | tee -a "$log"; }

scale=1  # a dry run's limits only catch a hang: 4x, for a CPU shared with other work
if [ "$dry" = 1 ]; then scale=4; fi

step() {  # step NAME SECONDS COMMAND...
    local name="$1" limit="$(($2 * scale))"
    shift 2
    say "=== $name (limit ${limit}s) ==="
    local start=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee -a "$log"
    local status=${PIPESTATUS[0]}
    say "=== $name: exit $status after $((SECONDS - start)) s ==="
}

# 0. The image's torch is the only torch: a wheel of it (or of a CUDA library) would shadow it.
site=/tmp/site
if compgen -G ".whl/*.whl" >/dev/null; then
    if compgen -G ".whl/torch-*.whl" >/dev/null || compgen -G ".whl/nvidia_*.whl" >/dev/null; then
        say "error: .whl/ holds torch or a CUDA wheel: the image's torch must be the one used; remove it"; exit 1
    fi
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl \
        2>&1 | tee -a "$log" || { say "error: installing .whl/ failed"; exit 1; }
    export PYTHONPATH="$site:$PWD"
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
{ command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$py" -c "import torch; print('python', __import__('sys').version.split()[0], 'torch', torch.__version__, 'at', torch.__file__, 'cuda', torch.version.cuda)"
  "$py" -c "import datasets, optuna, mlflow, trainer, search.study.local_executor; print('imports: ok (datasets', datasets.__version__, 'optuna', optuna.__version__, 'mlflow', mlflow.__version__ + ')')" \
    || echo "error: a package is missing: carry its wheel in .whl/ (benchmarks/gpu_wheels.sh)"; } 2>&1 | tee -a "$log"

# 1. Inductor needs a C compiler and Python's headers (Triton builds a launcher per kernel) and a
# working compile: checked in seconds here rather than minutes into the compiled steps.
# Ten seconds for the compile itself, counted after torch's import (seconds on a fresh machine).
compile=true
timeout 60 "$py" - <<'EOF' 2>&1 | tee -a "$log"
import os, shutil, signal, sys, sysconfig
import torch

def too_slow(*_):
    sys.exit("compile preflight: the tiny compile took over 10 s")

compiler = next((path for name in (os.environ.get("CC"), "cc", "gcc", "clang") if name for path in [shutil.which(name)] if path), None)
headers = os.path.join(sysconfig.get_paths()["include"], "Python.h")
if compiler is None or not os.path.isfile(headers):
    sys.exit(f"compile preflight: no C compiler ({compiler}) or no Python.h at {headers}")
device = "cuda" if torch.cuda.is_available() else "cpu"
signal.signal(signal.SIGALRM, too_slow)
signal.alarm(10)
value = torch.compile(lambda x: (x * 2).sin().sum(), fullgraph=True)(torch.ones(64, device=device))
print(f"compile preflight: ok on {device} ({compiler}, {headers}, result {float(value):.3f})")
EOF
[ "${PIPESTATUS[0]}" -eq 0 ] || { compile=false; say "compile preflight failed: the compiled steps run EAGER"; }
if [ "$dry" = 1 ]; then compile=false; say "dry run: tiny sizes on the CPU, eager (compiling would take minutes here)"; fi

# Derived configs in $work: the profile's batch, compile as the preflight allows, tiny in a dry run.
"$py" - "$work" "$compile" "$dry" <<'EOF' 2>&1 | tee -a "$log"
import sys, yaml
work, compile_model, dry = sys.argv[1], sys.argv[2] == "true", sys.argv[3] == "1"
profile = yaml.safe_load(open("search/profiles/gpu.yaml"))
config = yaml.safe_load(open("trainer/configs/crammed-bert.yaml"))
config["train"].update(profile["train"], compile=compile_model)
profile["train"] = {**profile["train"], "compile": compile_model}
profile.update(budget="10s", probe={"tasks": ["sst2", "rte"], "limits": {"max_train_examples": 2000, "max_seconds_per_task": 3.0}})
if dry:  # the test slice's vocabulary and rows; the CPU space; CPU trials
    config["arch"].update(layers=2, hidden=64, heads=4, vocab_size=2048, max_seq_len=64)
    config["train"].update(batch_size=16, micro_batch=8)
    profile.update(space="crammed_bert_cpu.yaml", run_config="crammed-bert-cpu.yaml", budget="3s",
                   resources={"cpus_per_trial": 1, "gpus_per_trial": 0}, train={"compile": False},
                   probe={"tasks": ["rte"], "limits": {"max_train_examples": 32, "max_seconds_per_task": 1.0}})
yaml.safe_dump(config, open(f"{work}/cram.yaml", "w"))
yaml.safe_dump(profile, open(f"{work}/profile.yaml", "w"))
print(f"configs: compile={compile_model} cram batch {config['train']['batch_size']} / {config['train']['micro_batch']}, "
      f"study budget {profile['budget']}")
EOF

check=(--steps 100 --eager-steps 20)
cram_budget=60s
probe=(--max-train-examples 8000 --max-seconds-per-task 8 --tasks sst2,rte)
if [ "$dry" = 1 ]; then check=(--dry-run); cram_budget=3s; probe=(--max-train-examples 32 --max-seconds-per-task 1 --tasks rte); fi
[ "$compile" = true ] || check+=(--eager)

step gpu_check 110 "$py" benchmarks/gpu_check.py "${check[@]}"
step cram 110 "$py" -m trainer.cram --config "$work/cram.yaml" --budget "$cram_budget" --data "$data" \
    --out "$work/crammed-bert" --checkpoint-every off
cp "$work/crammed-bert/result.json" "$out/cram_result.json" 2>/dev/null
step search 200 "$py" -m search.run --executor local --trials 4 --max-concurrent 1 --profile "$work/profile.yaml" --data "$data" \
    --study gpu-session --tracking-uri "sqlite:///$work/mlflow.db"
"$py" - "$work" "$out" <<'EOF' 2>&1 | tee -a "$log"
import json, sys
import optuna
work, out = sys.argv[1:]
optuna.logging.set_verbosity(optuna.logging.WARNING)
study = optuna.load_study(study_name="gpu-session", storage=f"sqlite:///{work}/optuna.db")
trials = [{"number": t.number, "state": t.state.name, "attrs": t.user_attrs} for t in study.get_trials()]
json.dump(trials, open(f"{out}/search_trials.json", "w"), indent=1, default=str)
for trial in trials:
    metrics = trial["attrs"].get("metrics", {})
    print(f"trial {trial['number']}: {trial['state']}", {key: metrics.get(key) for key in
          ("gpu_peak_gb", "tokens_per_s", "seconds", "validation_loss", "probe_average")})
EOF
step probe 45 "$py" benchmarks/probe_signal.py --checkpoint "$work/crammed-bert" --data "$data" --seeds 1 "${probe[@]}"
say "outputs: $out"
