#!/usr/bin/env bash
# crammed-bert tokens/s and MFU on a GPU, eager and compiled (see benchmarks/gpu_check.py).
set -euo pipefail
cd "$(dirname "$0")/.."
python benchmarks/gpu_check.py "$@"
