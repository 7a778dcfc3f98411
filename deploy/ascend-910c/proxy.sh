#!/usr/bin/env bash
# Example P/D proxy: vLLM-Ascend's load-balance proxy from its examples (not part of this package).
# VLLM_ASCEND_SRC defaults to where the official vLLM-Ascend image keeps its source (/vllm-workspace/vllm-ascend).
# DRY_RUN=1 prints the exact command instead of running it.
set -euo pipefail
P_HOST=${P_HOST:-127.0.0.1}; D_HOST=${D_HOST:-127.0.0.1}
PROXY=${VLLM_ASCEND_SRC:-/vllm-workspace/vllm-ascend}/examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py
if [ "${DRY_RUN:-0}" != 1 ] && [ ! -f "$PROXY" ]; then
  echo "proxy.sh: no proxy at $PROXY (set VLLM_ASCEND_SRC to a vLLM-Ascend source tree)" >&2; exit 2
fi
CMD=(python "$PROXY"
  --host 0.0.0.0 --port "${PROXY_PORT:-8000}"
  --prefiller-hosts "$P_HOST" --prefiller-ports "${P_PORT:-8100}"
  --decoder-hosts "$D_HOST" --decoder-ports "${D_PORT:-8200}")
if [ "${DRY_RUN:-0}" = 1 ]; then printf '%q ' "${CMD[@]}"; echo; exit 0; fi
exec "${CMD[@]}"
