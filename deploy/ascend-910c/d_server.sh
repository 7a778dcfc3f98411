#!/usr/bin/env bash
# The D (decode) server: 8 cards, kv_consumer. With SCENE_EPLB_PLUGIN=1 (needs the Ascend adapter)
# the plugin runs with role decode (no recorder) and reports its state on /scene_eplb/status.
# DRY_RUN=1 prints the exact command instead of running it.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/env.sh"
MODEL=${MODEL:-/models/DeepSeek-V3-w8a8}
PORT=${D_PORT:-8200}
KV=$(kv_transfer_config kv_consumer "${D_KV_PORT:-20002}" d0)
CMD=(python -m vllm.entrypoints.openai.api_server --model "$MODEL" --port "$PORT"
  --data-parallel-size "$D_DP" --tensor-parallel-size "$D_TP" --enable-expert-parallel
  --no-enable-prefix-caching --quantization ascend
  --kv-transfer-config "$KV")
if [ "${SCENE_EPLB_PLUGIN:-0}" = 1 ]; then CMD+=(--additional-config '{"scene_eplb": {"role": "decode"}}'); fi
if [ "${DRY_RUN:-0}" = 1 ]; then printf '%q ' "${CMD[@]}"; echo; exit 0; fi
exec "${CMD[@]}"
