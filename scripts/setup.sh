#!/usr/bin/env bash
# Create .venv with the project and what its tests need (numpy, pytest, hypothesis, matplotlib,
# CPU torch for .pt files). Idempotent: re-running only installs what is missing.
# Set SCENE_EPLB_VENV to use another folder.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SCENE_EPLB_VENV:-.venv}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
# torch 2.13.0 CPU: pin it so pip never pulls a multi-GB CUDA build.
"$VENV/bin/python" -c "import torch" 2>/dev/null || "${PIP[@]}" "torch==2.13.0"
"${PIP[@]}" -e ".[test,plots]"
echo "setup: $VENV ready ($("$VENV/bin/python" -c 'import torch, numpy; print("torch", torch.__version__, "numpy", numpy.__version__)'))"
