#!/usr/bin/env bash
# The P (prefill) server: 8 cards = 16 dies, DP16 with EP16, chunked prefill 8192, kv_producer.
#   bash p_server.sh collect            # collection run: plugin armed (role prefill, recorder idle), linear
#                                       # layout; the recorder routes are on this server's port
#   bash p_server.sh layout LAYOUT.json # layout run: the fitted layout (256 experts + 16 redundant slots);
#                                       # SCENE_EPLB_PLUGIN=0 loads it through vLLM-Ascend alone (its formula)
#   bash p_server.sh plain              # no plugin at all (verify.sh's throughput baseline)
# Knobs for verify.sh (collect and plain modes):
#   NATIVE_EPLB=1  vLLM-Ascend's dynamic EPLB on, with an algorithm interval far longer than any run: its
#                  moe_load counters count (verify.sh's check against them) and no expert ever moves
#   PREFILL_MC2=1  enable_prefill_mc2: passes of <= 512 tokens take MC2 (verify.sh's short-prompt check)
# DRY_RUN=1 prints the exact command instead of running it.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/env.sh"
MODE=${1:?usage: p_server.sh collect|layout [LAYOUT]|plain}
MODEL=${MODEL:-/models/DeepSeek-V3-w8a8}
PORT=${P_PORT:-8100}
CHUNK=${CHUNK:-8192}
KV=$(kv_transfer_config kv_producer "${P_KV_PORT:-20001}" p0)
PARTS=()  # the --additional-config object's members
if [ "${NATIVE_EPLB:-0}" = 1 ]; then
  if [ "$MODE" = layout ]; then echo "p_server.sh: NATIVE_EPLB=1 is for collect and plain runs (a layout run fixes the experts)" >&2; exit 2; fi
  export DYNAMIC_EPLB=true  # vLLM-Ascend's EplbConfig asserts it when dynamic_eplb is on
  PARTS+=('"eplb_config": {"dynamic_eplb": true, "expert_heat_collection_interval": 1, "algorithm_execution_interval": 100000000}')
fi
if [ "${PREFILL_MC2:-0}" = 1 ]; then PARTS+=('"enable_prefill_mc2": true'); fi
case "$MODE" in
  collect) EPLB='"scene_eplb": {"role": "prefill", "ring_entries": 512, "dump_dir": "'"$SCENE_EPLB_DIR"'/dumps"}' ;;
  layout)
    LAYOUT=${2:?layout mode needs the layout file}
    if [ "${SCENE_EPLB_PLUGIN:-1}" = 1 ]; then
      # The plugin checks the layout against the model, writes vLLM-Ascend's expert_map_path JSON
      # from it (vLLM-Ascend then loads weights and maps) and replaces its fixed replica formula
      # with our dispatch: DISPATCH=static (default: the layout's fitted table, local replica first)
      # or DISPATCH=dynamic (each expert's rows split evenly over its replicas); each worker logs
      # the line `scene-eplb audit` reads.
      EPLB='"scene_eplb": {"role": "prefill", "layout": "'"$LAYOUT"'", "dispatch": "'"${DISPATCH:-static}"'", "dump_dir": "'"$SCENE_EPLB_DIR"'/dumps"}'
    else
      # Without the plugin: vLLM-Ascend's own static-map path with its fixed generate_log2phy_map formula.
      EPLB='"eplb_config": {"expert_map_path": "'"${LAYOUT%.json}"'.expert_map.json"}'
    fi ;;
  plain) EPLB='' ;;
  *) echo "p_server.sh: unknown mode $MODE (collect, layout or plain)" >&2; exit 2 ;;
esac
if [ -n "$EPLB" ]; then PARTS+=("$EPLB"); fi
ADDITIONAL="{$(IFS=,; echo "${PARTS[*]}")}"
CMD=(python -m vllm.entrypoints.openai.api_server --model "$MODEL" --port "$PORT"
  --data-parallel-size "$P_DP" --tensor-parallel-size "$P_TP" --enable-expert-parallel
  --max-num-batched-tokens "$CHUNK" --enable-chunked-prefill --max-num-seqs 1
  --no-enable-prefix-caching --quantization ascend
  --kv-transfer-config "$KV"
  --additional-config "$ADDITIONAL")
if [ "$MODE" = layout ] && [ "${SCENE_EPLB_PLUGIN:-1}" != 1 ] && [ "${DRY_RUN:-0}" != 1 ]; then
  # Without the plugin vLLM-Ascend reads its own expert_map_path JSON: export it from our layout first.
  scene-eplb convert "$LAYOUT" --to vllm-ascend -o "${LAYOUT%.json}.expert_map.json" -q
fi
if [ "${DRY_RUN:-0}" = 1 ]; then printf '%q ' "${CMD[@]}"; echo; exit 0; fi
exec "${CMD[@]}"
