#!/usr/bin/env bash
# The P (prefill) server, kv_producer, eager, chunked prefill, EP over all its dies; its model and
# geometry are env.sh's RECIPE: v3 (DeepSeek-V3: 8 cards = 16 dies, DP2 x TP8, sized by the preflight),
# v4-flash-field (DeepSeek-V4-Flash: DP16 x TP1, one prefill request at a time) or v4-flash-tutorial
# (DP4 x TP4 with FlashComm1, shared-expert DP, DSA-CP and MTP 1, after vLLM-Ascend's V4-Flash tutorial).
#   bash p_server.sh collect            # collection run: plugin armed (role prefill, recorder idle)
#   bash p_server.sh layout LAYOUT.json # layout run: the fitted P layout (256 experts + 16 redundant slots)
#   bash p_server.sh plain              # no plugin at all
# Modes and knobs (DISPATCH, SCENE_EPLB_PLUGIN, NATIVE_EPLB, PREFILL_MC2, P_SEQUENCE_PARALLEL, P_MTP): env.sh.
# DRY_RUN=1 prints the exact command instead of running it.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/env.sh"
MODE=${1:?usage: p_server.sh collect|layout LAYOUT|plain}
if [ "${NATIVE_EPLB:-0}" = 1 ]; then export DYNAMIC_EPLB=true; fi  # vLLM-Ascend's EplbConfig asserts it with dynamic_eplb
FLASHCOMM=() SP=()  # the environment a dry run prints with the command; the preflight's flags for it
if [ "$P_SEQUENCE_PARALLEL" = 1 ]; then
  export VLLM_ASCEND_ENABLE_FLASHCOMM1=1; FLASHCOMM=(VLLM_ASCEND_ENABLE_FLASHCOMM1=1); SP=(--flashcomm1 --dsa-cp --shared-expert-dp)
fi
ADDITIONAL=$(server_config prefill "$MODE" "${2:-}") || { echo "p_server.sh: see above" >&2; exit 2; }
CMD=(python -m vllm.entrypoints.openai.api_server --model "$MODEL" --port "${P_PORT:-8100}"
  --data-parallel-size "$P_DP" --tensor-parallel-size "$P_TP" --enable-expert-parallel
  --max-num-batched-tokens "${CHUNK:-8192}" --enable-chunked-prefill --max-num-seqs "$P_MAX_NUM_SEQS"
  --max-model-len "$P_MAX_MODEL_LEN" --enforce-eager
  "$PREFIX_CACHING" --quantization "$QUANTIZATION" "${MODEL_ARGS[@]}"
  --kv-transfer-config "$(kv_transfer_config kv_producer "$P_KV_PORT" p0)"
  --additional-config "$ADDITIONAL")
if [ "$P_MTP" -gt 0 ]; then CMD+=(--speculative-config "{\"method\": \"mtp\", \"num_speculative_tokens\": $P_MTP, \"enforce_eager\": true}"); fi
MC2=(); if [ "${PREFILL_MC2:-0}" = 1 ]; then MC2=(--prefill-mc2); fi
preflight prefill "$MODE" "${2:-}" --dp "$P_DP" --tp "$P_TP" --max-model-len "$P_MAX_MODEL_LEN" \
  --max-num-seqs "$P_MAX_NUM_SEQS" --max-num-batched-tokens "${CHUNK:-8192}" --enforce-eager --speculative-tokens "$P_MTP" "${MC2[@]}" "${SP[@]}" ||
  { echo "p_server.sh: the recipe does not fit (see above)" >&2; exit 2; }
check_ports "$P_KV_PORT" "$((P_DP * P_TP))" || { echo "p_server.sh: see above" >&2; exit 2; }
check_network || { echo "p_server.sh: see above" >&2; exit 2; }
prepare_layout "$MODE" "${2:-}"
if [ "${DRY_RUN:-0}" = 1 ]; then printf 'HCCL_BUFFSIZE=%s ' "$HCCL_BUFFSIZE"; printf '%q ' "${FLASHCOMM[@]}" "${RECIPE_ENV[@]}" "${CMD[@]}"; echo; exit 0; fi
exec "${CMD[@]}"
