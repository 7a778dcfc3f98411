#!/usr/bin/env bash
# The D (decode) server, kv_consumer, EP over all its dies; its model and geometry are env.sh's RECIPE:
# v3 (DeepSeek-V3: 8 cards = 16 dies, DP4 x TP4, ACL graphs; or with D_NODES=2 two nodes, DP32 x TP1 with
# EP32, MTP1 and FULL_DECODE_ONLY graphs: run it on both, NODE_RANK=0 and 1, D_HEAD_IP node 0's address),
# or v4-flash-field / v4-flash-tutorial (DeepSeek-V4-Flash after vLLM-Ascend's V4-Flash tutorial: DP16 x
# TP1, FULL_DECODE_ONLY, MTP 1 eager, async scheduling, the recompute scheduler, shared-expert overlap, the
# tutorial's timeouts). MTP=1 adds the MTP drafter; every mode keeps it (the D that serves is the D verified).
#   bash d_server.sh collect            # collection run: plugin armed (role decode, recorder idle; a ring
#                                       # entry sums 16 decode steps, so 512 entries hold minutes)
#   bash d_server.sh layout LAYOUT.json # layout run: the fitted D layout (256 slots, R = 0: placement only)
#   bash d_server.sh plain              # no plugin at all
# Modes and knobs (DISPATCH, SCENE_EPLB_PLUGIN, NATIVE_EPLB, MTP_EAGER, D_ASYNC_SCHEDULING, D_RECOMPUTE_SCHEDULER,
# D_SHARED_EXPERT_OVERLAP): env.sh.
# DRY_RUN=1 prints the exact command instead of running it.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/env.sh"
MODE=${1:?usage: d_server.sh collect|layout LAYOUT|plain}
if [ "${NATIVE_EPLB:-0}" = 1 ]; then export DYNAMIC_EPLB=true; fi  # vLLM-Ascend's EplbConfig asserts it with dynamic_eplb
ADDITIONAL=$(server_config decode "$MODE" "${2:-}") || { echo "d_server.sh: see above" >&2; exit 2; }
CMD=(python -m vllm.entrypoints.openai.api_server --model "$MODEL" --port "${D_PORT:-8200}"
  --data-parallel-size "$D_DP" --tensor-parallel-size "$D_TP" --enable-expert-parallel
  --max-model-len "$D_MAX_MODEL_LEN" --max-num-seqs "$D_MAX_NUM_SEQS"
  --max-num-batched-tokens "$D_MAX_NUM_BATCHED_TOKENS"
  --cudagraph-metrics  # logs which passes replayed a graph, padded how (verify.sh's graph check reads it)
  "$PREFIX_CACHING" --quantization "$QUANTIZATION" "${MODEL_ARGS[@]}"
  --kv-transfer-config "$(kv_transfer_config kv_consumer "$D_KV_PORT" d0)"
  --additional-config "$ADDITIONAL")
EAGER=''; if [ "$MTP_EAGER" = 1 ]; then EAGER=', "enforce_eager": true'; fi  # the drafter out of the target's graphs
if [ "$MTP" -gt 0 ]; then CMD+=(--speculative-config "{\"method\": \"mtp\", \"num_speculative_tokens\": $MTP$EAGER}"); fi
if [ "$D_ASYNC_SCHEDULING" = 1 ]; then CMD+=(--async-scheduling); fi
if [ -n "$D_GRAPH_MODE" ]; then CMD+=(--compilation-config "{\"cudagraph_mode\": \"$D_GRAPH_MODE\"}"); fi
if [ "$D_NODES" = 2 ]; then  # 16 DP engines a node; node 1 serves no API (its engines join node 0's)
  CMD+=(--data-parallel-size-local $((D_DP / 2)) --data-parallel-start-rank $((${NODE_RANK:?D_NODES=2 needs NODE_RANK 0 or 1} * D_DP / 2))
    --data-parallel-address "${D_HEAD_IP:?D_NODES=2 needs D_HEAD_IP, node 0s address}" --data-parallel-rpc-port "${D_RPC_PORT:-13389}")
  if [ "$NODE_RANK" = 1 ]; then CMD+=(--headless); fi
fi
preflight decode "$MODE" "${2:-}" --dp "$D_DP" --tp "$D_TP" --max-model-len "$D_MAX_MODEL_LEN" \
  --max-num-seqs "$D_MAX_NUM_SEQS" --max-num-batched-tokens "$D_MAX_NUM_BATCHED_TOKENS" --kv-consumer \
  --speculative-tokens "$MTP" || { echo "d_server.sh: the recipe does not fit (see above)" >&2; exit 2; }
check_ports "$D_KV_PORT" "$((D_DP * D_TP))" || { echo "d_server.sh: see above" >&2; exit 2; }
check_network || { echo "d_server.sh: see above" >&2; exit 2; }
prepare_layout "$MODE" "${2:-}"
if [ "${DRY_RUN:-0}" = 1 ]; then printf 'HCCL_BUFFSIZE=%s ' "$HCCL_BUFFSIZE"; printf '%q ' "${RECIPE_ENV[@]}" "${CMD[@]}"; echo; exit 0; fi
exec "${CMD[@]}"
