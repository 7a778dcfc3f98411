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
# HCCL buffer per communicator, in MB: MoE dispatch/combine (MC2) operators partition it. Not set
# here: each server's preflight (below) sets it from its MC2 capacity (at least CANN's 200), and
# refuses a value set by hand that is below what MC2 needs.
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
# Sized to a 64 GB 910C die by `scene-eplb preflight` (DeepSeek-V3 W8A8): at TP1 the non-routed
# weights (about 18 GiB) and 16-17 expert slots (38-40 GiB) leave no KV cache under 0.9 x 64 GiB, so P
# runs TP8 (vLLM-Ascend's PD prefill recipe) and D DP4/TP4 (its single-node DeepSeek recipe); EP stays 16.
# D_NODES=2: D on two nodes (vLLM-Ascend's P/D guide): DP32 x TP1 (EP32, 16 DP engines a node), MTP1
# and FULL_DECODE_ONLY graphs; set it on both nodes of D and on P (its KV connector names D's sizes),
# with NODE_RANK (0: the head, which serves the API; 1: headless) and D_HEAD_IP (node 0's address).
# MTP=N: vLLM-Ascend's MTP drafter with N speculative tokens (its DeepSeek D recipes use 1); the
# preflight counts its layer. D_GRAPH_MODE: the cudagraph_mode D runs (empty: vLLM-Ascend's default).
# RECIPE: the model and the pair's geometry (README.md in this folder):
#   v3                 DeepSeek-V3 W8A8 (the default): the sizes below
#   v4-flash-field     DeepSeek-V4-Flash W8A8 (ModelSlim's copy, `--quantization ascend`). P after the field's
#                      nodes: EP16 over 16 dies as DP16 x TP1 (no context parallelism), chunk 8192, one prefill
#                      request at a time, 256 experts + 16 redundant slots (17 a rank).
#                      D after vLLM-Ascend 0.23.0.post1's V4-Flash tutorial (A3 1P1D): DP16 x TP1,
#                      FULL_DECODE_ONLY graphs, MTP 1 (eager), async scheduling, the recompute scheduler,
#                      shared-expert overlap, 120 batched tokens, 60 sequences, the tutorial's timeouts (the
#                      tutorial's max_model_len 1048576 x 60 is 63M tokens: the preflight refuses it).
#   v4-flash-tutorial  the same D; P after the tutorial: DP4 x TP4 eager, chunk 8192, 16 sequences, MTP 1,
#                      FlashComm1 (VLLM_ASCEND_ENABLE_FLASHCOMM1=1), enable_shared_expert_dp and enable_dsa_cp
#                      (P_SEQUENCE_PARALLEL=1; the recorder counts each rank's own sequence-parallel chunk).
# V4 pairs use MooncakeHybridConnector (V4's caches are several KV groups), the tutorial's block size 128
# and hybrid KV cache manager; their handshake ports stay at 36000 / 36100 (the tutorial's 30000 / 30100 lie
# in the transfer engine's ports of a 16-NPU node, which check_ports refuses). `scene-eplb preflight` sizes
# every V4 side as it does V3's (each server runs it first). EXPERT_GROUPS is the model's n_group (collect.sh).
export RECIPE=${RECIPE:-v3}
# shellcheck disable=SC2034  # read by p_server.sh and d_server.sh, which source this file
MODEL_ARGS=() RECIPE_ENV=()  # the server flags the model itself needs; the environment its recipe sets (dry runs print it)
case "$RECIPE" in
  v3) export MODEL=${MODEL:-/models/DeepSeek-V3-w8a8} KV_CONNECTOR=${KV_CONNECTOR:-MooncakeConnectorV1} EXPERT_GROUPS=${EXPERT_GROUPS:-8} ;;
  v4-flash-field | v4-flash-tutorial)
    export MODEL=${MODEL:-/models/DeepSeek-V4-Flash-w8a8-mtp} KV_CONNECTOR=${KV_CONNECTOR:-MooncakeHybridConnector} EXPERT_GROUPS=${EXPERT_GROUPS:-1}
    BLOCK_SIZE=${BLOCK_SIZE:-128}
    # shellcheck disable=SC2034
    MODEL_ARGS=(--block-size "$BLOCK_SIZE" --no-disable-hybrid-kv-cache-manager --tokenizer-mode deepseek_v4)
    export D_DP=${D_DP:-16} D_TP=${D_TP:-1} MTP=${MTP:-1} D_GRAPH_MODE=${D_GRAPH_MODE:-FULL_DECODE_ONLY}
    export D_MAX_NUM_SEQS=${D_MAX_NUM_SEQS:-60} D_MAX_NUM_BATCHED_TOKENS=${D_MAX_NUM_BATCHED_TOKENS:-120}
    # the tutorial's D: the drafter eager (kept out of FULL_DECODE_ONLY graphs), async scheduling, and in
    # vLLM-Ascend's additional config recompute_scheduler_enable (D only) and multistream_overlap_shared_expert
    export MTP_EAGER=${MTP_EAGER:-1} D_ASYNC_SCHEDULING=${D_ASYNC_SCHEDULING:-1} D_RECOMPUTE_SCHEDULER=${D_RECOMPUTE_SCHEDULER:-1}
    export D_SHARED_EXPERT_OVERLAP=${D_SHARED_EXPERT_OVERLAP:-1}
    # the tutorial's timeouts, both sides (vllm-ascend releases/v0.23.0,
    # docs/source/tutorials/models/DeepSeek-V4-Flash.md, 5.2.1 A3 PD): vLLM's executor waits 300 s for a
    # model step, which vLLM-Ascend's platform raises to 3000 s (above HCCL's 1836 s operator limit) and a cold
    # operator compile can still pass; HCCL_EXEC_TIMEOUT is CANN HCCL's limit per collective. Its
    # VLLM_RPC_TIMEOUT=3600000 is left out: neither vLLM 0.23 nor vLLM-Ascend 0.23.0.post1 reads it.
    export VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=${VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS:-30000} HCCL_EXEC_TIMEOUT=${HCCL_EXEC_TIMEOUT:-204}
    # shellcheck disable=SC2034
    RECIPE_ENV=("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=$VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS" "HCCL_EXEC_TIMEOUT=$HCCL_EXEC_TIMEOUT")
    if [ "$RECIPE" = v4-flash-field ]; then
      export P_DP=${P_DP:-16} P_TP=${P_TP:-1} P_MAX_NUM_SEQS=${P_MAX_NUM_SEQS:-1}
    else
      export P_DP=${P_DP:-4} P_TP=${P_TP:-4} P_MAX_NUM_SEQS=${P_MAX_NUM_SEQS:-16} P_MTP=${P_MTP:-1} P_SEQUENCE_PARALLEL=${P_SEQUENCE_PARALLEL:-1}
    fi ;;
  *) echo "env.sh: RECIPE is v3, v4-flash-field or v4-flash-tutorial, got $RECIPE" >&2; return 2 ;;
esac
# P_MTP=N: the MTP drafter on P too (the V4-Flash tutorial's P runs it eager); P_SEQUENCE_PARALLEL=1: FlashComm1,
# shared-expert DP and DSA-CP on P (server_config and p_server.sh).
export P_MTP=${P_MTP:-0} P_SEQUENCE_PARALLEL=${P_SEQUENCE_PARALLEL:-0}
# D's knobs after the V4-Flash tutorial (off for V3): MTP_EAGER=1 the drafter eager, D_ASYNC_SCHEDULING=1
# --async-scheduling (vLLM 0.23 schedules async with an MTP drafter anyway; the flag makes an incompatible
# setting fail the start), D_RECOMPUTE_SCHEDULER=1 recompute_scheduler_enable (vLLM-Ascend's scheduler for a
# kv_consumer: it recomputes the last prompt token with placeholder drafts, and a request D has no KV room for
# goes back to the proxy), D_SHARED_EXPERT_OVERLAP=1 multistream_overlap_shared_expert (server_config).
export MTP_EAGER=${MTP_EAGER:-0} D_ASYNC_SCHEDULING=${D_ASYNC_SCHEDULING:-0} D_RECOMPUTE_SCHEDULER=${D_RECOMPUTE_SCHEDULER:-0}
export D_SHARED_EXPERT_OVERLAP=${D_SHARED_EXPERT_OVERLAP:-0}
export D_NODES=${D_NODES:-1}
if [ "$D_NODES" = 2 ]; then
  export D_DP=${D_DP:-32} D_TP=${D_TP:-1} MTP=${MTP:-1} D_GRAPH_MODE=${D_GRAPH_MODE:-FULL_DECODE_ONLY} D_MAX_NUM_SEQS=${D_MAX_NUM_SEQS:-11}
fi
export P_DP=${P_DP:-2} P_TP=${P_TP:-8} D_DP=${D_DP:-4} D_TP=${D_TP:-4} MTP=${MTP:-0} D_GRAPH_MODE=${D_GRAPH_MODE:-}
# The scene both servers take (collect.sh's IN_LEN, OUT_LEN and PREFIX_SHARE, the same defaults): P a prompt
# and the one token it generates (--max-model-len IN_LEN + 1), D the prompt and its output (IN_LEN + OUT_LEN).
# A share above 0 turns prefix caching on for both (off otherwise); PREFIX_LEN, the prompt's shared prefix
# (IN_LEN x PREFIX_SHARE, rounded as `scene-eplb bench` rounds it), is held once by the preflight.
SCENE_IN_LEN=${IN_LEN:-16384} SCENE_OUT_LEN=${OUT_LEN:-1024} SCENE_PREFIX_SHARE=${PREFIX_SHARE:-0}
if ! PREFIX_LEN=$(awk -v n="$SCENE_IN_LEN" -v s="$SCENE_PREFIX_SHARE" 'BEGIN {
    if (n !~ /^[0-9]+$/ || n < 1 || s !~ /^[0-9]*\.?[0-9]+$/ || s >= 1) exit 1; x = n * s; r = int(x + 0.5)
    if (r - x == 0.5 && r % 2) r -= 1; print r }'); then  # Python's round: a tie to the even neighbour
  echo "env.sh: IN_LEN ($SCENE_IN_LEN) is a token count >= 1 and PREFIX_SHARE ($SCENE_PREFIX_SHARE) a share in [0, 1)" >&2; return 2
fi
if [ "$PREFIX_LEN" -gt 0 ]; then PREFIX_CACHING=--enable-prefix-caching; else PREFIX_CACHING=--no-enable-prefix-caching; fi
export SCENE_IN_LEN SCENE_OUT_LEN SCENE_PREFIX_SHARE PREFIX_LEN PREFIX_CACHING
# Sequence lengths and batch sizes the preflight checks the KV cache against (max_num_seqs sequences
# of max_model_len tokens each, the shared prefix once), and the redundant slots of each side's layouts
# (collect.sh fits them). DeepSeek-V3's D at the default scene (17,408 tokens): 8 sequences a rank at
# DP4 x TP4 (7 with MTP), 11 on two nodes. D batches at most 1024 tokens: above that MLAPO keeps the
# original q_a/kv_a/q_b weights beside its fused copy (about 1.4 GiB a rank at TP4, counted by the preflight).
export P_MAX_MODEL_LEN=${P_MAX_MODEL_LEN:-$((SCENE_IN_LEN + 1))} P_MAX_NUM_SEQS=${P_MAX_NUM_SEQS:-1}
if [ "$MTP" -gt 0 ]; then export D_MAX_NUM_SEQS=${D_MAX_NUM_SEQS:-7}; fi
export D_MAX_MODEL_LEN=${D_MAX_MODEL_LEN:-$((SCENE_IN_LEN + SCENE_OUT_LEN))} D_MAX_NUM_SEQS=${D_MAX_NUM_SEQS:-8}
export D_MAX_NUM_BATCHED_TOKENS=${D_MAX_NUM_BATCHED_TOKENS:-1024}
# The checkpoint's quantisation as the servers pass it (--quantization), and what their preflight checks it against
export QUANTIZATION=${QUANTIZATION:-ascend}
export REDUNDANT=${REDUNDANT:-16} D_REDUNDANT=${D_REDUNDANT:-0}
# The command that runs this package's CLI (the image's console script; tests point it elsewhere).
SCENE_EPLB_CLI=${SCENE_EPLB_CLI:-scene-eplb}
# preflight ROLE MODE LAYOUT ARGS...: `scene-eplb preflight` for one side's recipe (ARGS: its --dp,
# --tp, --max-model-len, ... as the server gets them; the quantisation, the scene's shared prefix and the
# block size added here); a recipe that does not fit, or whose --quantization is not the checkpoint's,
# stops here with the numbers, one that fits exports the HCCL_BUFFSIZE its MC2 capacity needs.
preflight() {
  local role=$1 mode=$2 layout=$3 slots=(); shift 3
  if [ "$mode" = layout ] && [ -f "$layout" ]; then slots=(--layout "$layout")
  elif [ "$mode" = layout ] && [ "$role" = prefill ]; then slots=(--redundant "$REDUNDANT")  # a dry run's layout
  elif [ "$mode" = layout ]; then slots=(--redundant "$D_REDUNDANT")
  fi
  local hccl=()
  if [ -n "${HCCL_BUFFSIZE:-}" ]; then hccl=(--hccl-buffsize "$HCCL_BUFFSIZE"); fi
  if [ "${NATIVE_EPLB:-0}" = 1 ]; then hccl+=(--native-eplb); fi  # its swap buffer
  local line scene=(--quantization "$QUANTIZATION" --shared-prefix "$PREFIX_LEN" --block-size "${BLOCK_SIZE:-128}")
  if ! command -v "$SCENE_EPLB_CLI" > /dev/null; then echo "env.sh: $SCENE_EPLB_CLI not found: install vllm_scene_eplb" >&2; return 2; fi
  line=$("$SCENE_EPLB_CLI" preflight --model "$MODEL" "$@" "${slots[@]}" "${hccl[@]}" "${scene[@]}" --shell -q) || return 2
  export "${line?}"
  echo "env.sh: preflight of the $role recipe passed, $line" >&2
}
# metrics URL FILE: a server's /metrics page saved (what warm_check reads, twice).
metrics() {
  curl -sf --max-time 30 "$1/metrics" -o "$2" || { echo "env.sh: cannot read $1/metrics" >&2; return 2; }
}
# warm_check BEFORE AFTER [COUNTS]: the cache scene proven warm from the server's own counters between two
# saved /metrics pages (`scene-eplb warm-check`: prefix-cache hits over queries per DP engine, at most
# WARM_MARGIN, 0.02, under PREFIX_SHARE); a cold server stops here in one line. With COUNTS, the record
# those pages bracket: the measured share is written into its metadata (fit and report print it).
warm_check() {
  local stamp=(); if [ -n "${3:-}" ]; then stamp=(--stamp "$3"); fi
  "$SCENE_EPLB_CLI" warm-check "$1" "$2" --share "$SCENE_PREFIX_SHARE" --margin "${WARM_MARGIN:-0.02}" "${stamp[@]}" -q
}
# The network this node's servers talk over: HCCL (device collectives), Gloo (vLLM's CPU groups), the
# TP socket and Mooncake's transfer engine. One place for all of them; check_network says in one line
# which are missing or wrong (the servers refuse to start then, a dry run only warns).
#   HCCL_IF_IP          this node's IP for HCCL's host-side rendezvous
#   GLOO_SOCKET_IFNAME  the NIC Gloo binds (vLLM's CPU groups, the plugin's export groups)
#   HCCL_SOCKET_IFNAME  the NIC HCCL's sockets bind
#   TP_SOCKET_IFNAME    the NIC of vLLM-Ascend's TP/DP socket traffic
#   MOONCAKE_LIB_DIR    the folder of Mooncake's shared libraries (the installed mooncake package's
#                       folder by default), put on LD_LIBRARY_PATH for the transfer engine to load
check_network() {
  local missing=() nic
  if [ -z "${MOONCAKE_LIB_DIR:-}" ]; then
    MOONCAKE_LIB_DIR=$(python -c 'import mooncake, os; print(os.path.dirname(mooncake.__file__))' 2> /dev/null || true)
  fi
  if [ -z "${HCCL_IF_IP:-}" ]; then missing+=("HCCL_IF_IP unset")
  elif command -v hostname > /dev/null && ! hostname -I 2> /dev/null | tr ' ' '\n' | grep -qx "$HCCL_IF_IP"; then
    missing+=("HCCL_IF_IP $HCCL_IF_IP is not an address of this host")
  fi
  for nic in GLOO_SOCKET_IFNAME HCCL_SOCKET_IFNAME TP_SOCKET_IFNAME; do
    if [ -z "${!nic:-}" ]; then missing+=("$nic unset")
    elif [ ! -e "/sys/class/net/${!nic}" ]; then missing+=("$nic ${!nic} is not a NIC of this host"); fi
  done
  if [ -z "${MOONCAKE_LIB_DIR:-}" ] || ! compgen -G "$MOONCAKE_LIB_DIR/*.so*" > /dev/null; then
    missing+=("MOONCAKE_LIB_DIR ${MOONCAKE_LIB_DIR:-unset} holds no Mooncake libraries (pip install mooncake-transfer-engine)")
  else
    export LD_LIBRARY_PATH="$MOONCAKE_LIB_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  if [ "${#missing[@]}" = 0 ]; then return 0; fi
  echo "env.sh: network not set up: $(IFS=';'; echo "${missing[*]}") (set them in the environment, see README.md)" >&2
  [ "${DRY_RUN:-0}" = 1 ]
}
export HCCL_IF_IP GLOO_SOCKET_IFNAME HCCL_SOCKET_IFNAME TP_SOCKET_IFNAME MOONCAKE_LIB_DIR
# Mooncake's KV handshake ports: vLLM-Ascend's MooncakeConnectorV1 worker listens on kv_port + its
# global DP rank x TP + its TP rank, so a DP x TP server takes kv_port .. kv_port + DP x TP - 1 (across
# its nodes); its transfer engine (AscendDirectTransport) takes random ports in [20000, 20000 + 1000 x
# NPUs) of the node, and vLLM-Ascend's P/D guide asks kv_port >= 36000 ("Address already in use" else).
export P_KV_PORT=${P_KV_PORT:-36000} D_KV_PORT=${D_KV_PORT:-36100}
# check_ports PORT SPAN: the SPAN handshake ports from PORT clear of the transfer engine's range for
# this node's NPU count (NPUS, default the /dev/davinciN devices, else 16: a 910C node's dies) and of
# 36000, and below 65536; says which ports it checked, or why they do not do (the server does not start).
check_ports() {
  local first=$1 last=$(($1 + $2 - 1)) npus floor
  npus=${NPUS:-$(compgen -G "/dev/davinci[0-9]*" | wc -l)}
  if [ "$npus" -lt 1 ]; then npus=16; fi
  floor=$((20000 + 1000 * npus)); if [ "$floor" -lt 36000 ]; then floor=36000; fi
  if [ "$first" -lt "$floor" ] || [ "$last" -gt 65535 ]; then
    echo "env.sh: KV handshake ports $first-$last must lie in $floor-65535: Mooncake's transfer engine takes ports 20000-$((20000 + 1000 * npus - 1)) on this node's $npus NPUs (set the side's KV_PORT)" >&2
    return 2
  fi
  echo "env.sh: KV handshake ports $first-$last, clear of Mooncake's transfer ports 20000-$((20000 + 1000 * npus - 1)) ($npus NPUs)" >&2
}
# kv_transfer_config ROLE PORT ENGINE_ID: the --kv-transfer-config JSON of one side of the pair (KV_CONNECTOR:
# MooncakeConnectorV1 for V3, MooncakeHybridConnector for V4; both read the same extra config).
kv_transfer_config() {
  printf '{"kv_connector": "%s", "kv_role": "%s", "kv_port": "%s", "engine_id": "%s", ' "$KV_CONNECTOR" "$1" "$2" "$3"
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
#   P_SEQUENCE_PARALLEL=1  (prefill) enable_shared_expert_dp and enable_dsa_cp, with FlashComm1 (p_server.sh)
#   D_RECOMPUTE_SCHEDULER=1, D_SHARED_EXPERT_OVERLAP=1  (decode) recompute_scheduler_enable, multistream_overlap_shared_expert
server_config() {
  local role=$1 mode=$2 layout=${3:-} parts=()
  if [ "${NATIVE_EPLB:-0}" = 1 ]; then
    if [ "$mode" = layout ]; then echo "NATIVE_EPLB=1 is for collect and plain runs (a layout run fixes the experts)" >&2; return 2; fi
    parts+=('"eplb_config": {"dynamic_eplb": true, "expert_heat_collection_interval": 1, "algorithm_execution_interval": 100000000}')
  fi
  if [ "${PREFILL_MC2:-0}" = 1 ]; then parts+=('"enable_prefill_mc2": true'); fi
  if [ "$role" = prefill ] && [ "$P_SEQUENCE_PARALLEL" = 1 ]; then parts+=('"enable_shared_expert_dp": true' '"enable_dsa_cp": true'); fi
  if [ "$role" = decode ] && [ "$D_RECOMPUTE_SCHEDULER" = 1 ]; then parts+=('"recompute_scheduler_enable": true'); fi
  if [ "$role" = decode ] && [ "$D_SHARED_EXPERT_OVERLAP" = 1 ]; then parts+=('"multistream_overlap_shared_expert": true'); fi
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
