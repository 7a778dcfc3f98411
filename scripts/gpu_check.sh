#!/usr/bin/env bash
# The CUDA acceptance check (one GPU, torch and Triton only, no vLLM, nothing downloaded): one
# PASS/FAIL line per check, under 8 minutes; exits non-zero on any FAIL and without a CUDA GPU.
# Usage: bash scripts/gpu_check.sh   (PYTHON=... to choose the interpreter)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
exec timeout 480 "${PYTHON:-python}" "$repo/scripts/gpu_check.py"
