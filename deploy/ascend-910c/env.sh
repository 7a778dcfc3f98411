#!/usr/bin/env bash
# Environment for the P and D servers on Ascend 910C (vLLM-Ascend 0.23.0.post1 + vLLM 0.23.0).
# Source it: `source deploy/ascend-910c/env.sh`. Every value can be overridden before sourcing.
# Nothing here has run on Ascend hardware from this repository (see README.md in this folder).

# CANN toolkit and ATB (set_env.sh paths of a default CANN install): sourced where they exist, and
# said on stderr either way (a missing one is why a server then fails to find its NPU libraries).
export ASCEND_HOME=${ASCEND_HOME:-/usr/local/Ascend}
for _scene_eplb_env in "$ASCEND_HOME/ascend-toolkit/set_env.sh" "$ASCEND_HOME/nnal/atb/set_env.sh"; do
  if [ -f "$_scene_eplb_env" ]; then
    # shellcheck source=/dev/null
    source "$_scene_eplb_env"
    echo "env.sh: sourced $_scene_eplb_env" >&2
  else
    echo "env.sh: not found: $_scene_eplb_env (CANN or ATB is not installed there; set ASCEND_HOME)" >&2
  fi
done
unset _scene_eplb_env
# HCCL buffer per communicator, in MB. MoE dispatch/combine (MC2) operators partition this buffer;
# 200 is vLLM-Ascend's default for its groups. Larger costs 2x per communicator per NPU.
export HCCL_BUFFSIZE=${HCCL_BUFFSIZE:-200}
# Let HCCL expand collectives on the AI vector cores (lower latency for small messages on A3).
export HCCL_OP_EXPANSION_MODE=${HCCL_OP_EXPANSION_MODE:-AIV}
# Seconds HCCL waits for all ranks to join; cold P/D starts across 8 cards can exceed the default.
export HCCL_CONNECT_TIMEOUT=${HCCL_CONNECT_TIMEOUT:-1200}
# Host-side task queue: overlaps operator launch with execution.
export TASK_QUEUE_ENABLE=${TASK_QUEUE_ENABLE:-1}
# Expandable NPU memory segments: less fragmentation with long chunked prefills.
export PYTORCH_NPU_ALLOC_CONF=${PYTORCH_NPU_ALLOC_CONF:-expandable_segments:True}
# CPU threads per worker process; the NPU does the math.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-10}
# VLLM_PLUGINS is deliberately left unset: when set it is an allow-list for every plugin group, and
# one that leaves out vLLM-Ascend's own plugins (the `ascend` platform plugin, its KV connector and
# model plugins) breaks the server. Unset, vLLM loads every general plugin, scene_eplb included.
# The P/D pair's parallel sizes, one place for both servers and for the KV connector's extra config
# (vLLM-Ascend's MooncakeConnectorV1 asserts that `prefill` and `decode` each carry tp_size and dp_size,
# and its platform refuses a server whose own size differs from its side's entry).
export P_DP=${P_DP:-16} P_TP=${P_TP:-1} D_DP=${D_DP:-16} D_TP=${D_TP:-1}
# kv_transfer_config ROLE PORT ENGINE_ID: the --kv-transfer-config JSON of one side of the pair.
kv_transfer_config() {
  printf '{"kv_connector": "MooncakeConnectorV1", "kv_role": "%s", "kv_port": "%s", "engine_id": "%s", ' "$1" "$2" "$3"
  printf '"kv_connector_extra_config": {"prefill": {"dp_size": %d, "tp_size": %d}, "decode": {"dp_size": %d, "tp_size": %d}}}' \
    "$P_DP" "$P_TP" "$D_DP" "$D_TP"
}
# server_config ROLE MODE [LAYOUT]: the --additional-config JSON of a P (ROLE prefill) or D (decode)
# server in MODE, with verify.sh's knobs:
#   collect  the plugin armed (recorder idle) on the linear layout; the recorder routes on the server's port
#   layout   the fitted LAYOUT: the plugin checks it against the model, writes vLLM-Ascend's expert_map_path
#            JSON from it (vLLM-Ascend then loads weights and maps) and replaces its fixed replica formula
#            with our dispatch: DISPATCH=static (default: the fitted table, local replica first) or
#            DISPATCH=dynamic (each expert's rows split evenly over its replicas); each worker logs the
#            line `scene-eplb audit` reads. SCENE_EPLB_PLUGIN=0: vLLM-Ascend's own static-map path alone
#            (its generate_log2phy_map formula), from the map `prepare_layout` converts
#   plain    no plugin at all (verify.sh's throughput baseline)
#   NATIVE_EPLB=1  (collect, plain) vLLM-Ascend's dynamic EPLB with an algorithm interval far longer than
#                  any run: its moe_load counters count (verify.sh checks ours against them), no expert moves
#   PREFILL_MC2=1  enable_prefill_mc2: passes of <= 512 tokens take MC2 (verify.sh's short-prompt check)
server_config() {
  local role=$1 mode=$2 layout=${3:-} parts=()
  if [ "${NATIVE_EPLB:-0}" = 1 ]; then
    if [ "$mode" = layout ]; then echo "NATIVE_EPLB=1 is for collect and plain runs (a layout run fixes the experts)" >&2; return 2; fi
    parts+=('"eplb_config": {"dynamic_eplb": true, "expert_heat_collection_interval": 1, "algorithm_execution_interval": 100000000}')
  fi
  if [ "${PREFILL_MC2:-0}" = 1 ]; then parts+=('"enable_prefill_mc2": true'); fi
  case "$mode" in
    collect) parts+=("\"scene_eplb\": {\"role\": \"$role\", \"ring_entries\": 512, \"dump_dir\": \"$SCENE_EPLB_DIR/dumps\"}") ;;
    layout)
      if [ -z "$layout" ]; then echo "layout mode needs the layout file" >&2; return 2; fi
      if [ "${SCENE_EPLB_PLUGIN:-1}" = 1 ]; then
        parts+=("\"scene_eplb\": {\"role\": \"$role\", \"layout\": \"$layout\", \"dispatch\": \"${DISPATCH:-static}\", \"dump_dir\": \"$SCENE_EPLB_DIR/dumps\"}")
      else
        parts+=("\"eplb_config\": {\"expert_map_path\": \"${layout%.json}.expert_map.json\"}")
      fi ;;
    plain) ;;
    *) echo "unknown mode $mode (collect, layout or plain)" >&2; return 2 ;;
  esac
  echo "{$(IFS=,; echo "${parts[*]}")}"
}
# prepare_layout MODE LAYOUT: without the plugin vLLM-Ascend reads its own expert_map_path JSON, so a
# plugin-off layout run exports it from our layout first (nothing to do otherwise, or in a dry run).
prepare_layout() {
  if [ "$1" = layout ] && [ "${SCENE_EPLB_PLUGIN:-1}" != 1 ] && [ "${DRY_RUN:-0}" != 1 ]; then
    scene-eplb convert "$2" --to vllm-ascend -o "${2%.json}.expert_map.json" -q
  fi
}
# Where the P server writes counts dumps, and where layouts and bench results go.
export SCENE_EPLB_DIR=${SCENE_EPLB_DIR:-/data/scene-eplb}
