#!/usr/bin/env bash
# The P (prefill) server: 8 cards = 16 dies, DP2 x TP8 with EP16 (sized by the preflight), eager,
# chunked prefill 8192, kv_producer.
#   bash p_server.sh collect            # collection run: plugin armed (role prefill, recorder idle)
#   bash p_server.sh layout LAYOUT.json # layout run: the fitted P layout (256 experts + 16 redundant slots)
#   bash p_server.sh plain              # no plugin at all
# Modes and knobs (DISPATCH, SCENE_EPLB_PLUGIN, NATIVE_EPLB, PREFILL_MC2): server_config in env.sh.
# DRY_RUN=1 prints the exact command instead of running it.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/env.sh"
MODE=${1:?usage: p_server.sh collect|layout LAYOUT|plain}
MODEL=${MODEL:-/models/DeepSeek-V3-w8a8}
if [ "${NATIVE_EPLB:-0}" = 1 ]; then export DYNAMIC_EPLB=true; fi  # vLLM-Ascend's EplbConfig asserts it with dynamic_eplb
ADDITIONAL=$(server_config prefill "$MODE" "${2:-}") || { echo "p_server.sh: see above" >&2; exit 2; }
CMD=(python -m vllm.entrypoints.openai.api_server --model "$MODEL" --port "${P_PORT:-8100}"
  --data-parallel-size "$P_DP" --tensor-parallel-size "$P_TP" --enable-expert-parallel
  --max-num-batched-tokens "${CHUNK:-8192}" --enable-chunked-prefill --max-num-seqs "$P_MAX_NUM_SEQS"
  --max-model-len "$P_MAX_MODEL_LEN" --enforce-eager
  --no-enable-prefix-caching --quantization ascend
  --kv-transfer-config "$(kv_transfer_config kv_producer "$P_KV_PORT" p0)"
  --additional-config "$ADDITIONAL")
MC2=(); if [ "${PREFILL_MC2:-0}" = 1 ]; then MC2=(--prefill-mc2); fi
preflight prefill "$MODE" "${2:-}" --dp "$P_DP" --tp "$P_TP" --max-model-len "$P_MAX_MODEL_LEN" \
  --max-num-seqs "$P_MAX_NUM_SEQS" --max-num-batched-tokens "${CHUNK:-8192}" --enforce-eager "${MC2[@]}" ||
  { echo "p_server.sh: the recipe does not fit (see above)" >&2; exit 2; }
check_ports "$P_KV_PORT" "$((P_DP * P_TP))" || { echo "p_server.sh: see above" >&2; exit 2; }
check_network || { echo "p_server.sh: see above" >&2; exit 2; }
prepare_layout "$MODE" "${2:-}"
if [ "${DRY_RUN:-0}" = 1 ]; then printf 'HCCL_BUFFSIZE=%s ' "$HCCL_BUFFSIZE"; printf '%q ' "${CMD[@]}"; echo; exit 0; fi
exec "${CMD[@]}"
