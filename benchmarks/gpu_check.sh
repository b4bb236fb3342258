#!/usr/bin/env bash
# crammed-bert tokens/s and MFU on a GPU, eager and compiled (see benchmarks/gpu_check.py).
# PYTHON names the interpreter (default python3), e.g. PYTHON=venv/bin/python without activating it.
set -euo pipefail
cd "$(dirname "$0")/.."
"${PYTHON:-python3}" benchmarks/gpu_check.py "$@"
