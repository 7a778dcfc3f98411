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
# Where the P server writes counts dumps, and where layouts and bench results go.
export SCENE_EPLB_DIR=${SCENE_EPLB_DIR:-/data/scene-eplb}
