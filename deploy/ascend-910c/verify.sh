#!/usr/bin/env bash
# Acceptance of the scene_eplb recorder on a 910C P node (SIDE=p, the default) or D node (SIDE=d). It
# starts and stops that server itself (p_server.sh or d_server.sh), so run it where that server is not
# running. One PASS/FAIL/SKIP line per check; any
# step that fails prints `FAIL <step>: ...`, the checks that need it are skipped with a line, and the
# script exits non-zero. The checks, in order:
#   1 audit       P up with the flag (collect mode, vLLM-Ascend's counters on): recorder idle and agreed
#                 on every rank, no skipped passes since startup
#   2 totals      a known load (N prompts of IN_LEN tokens, one output token: prefill passes only)
#                 recorded and dumped; every MoE layer's total = the engine's own prompt-token count
#                 (vllm:prompt_tokens_total, before/after) x top-k: each real token once, no padding, no dummy
#   3 native      the same dump against vLLM-Ascend's own moe_load counters over the record (p_server.sh's
#                 NATIVE_EPLB=1: dynamic EPLB on, algorithm interval longer than the run, so nothing moves):
#                 never above them, expert shares per layer within TOLERANCE
#   4 graph       a load with GRAPH_OUT_LEN output tokens: its decode passes (one token each, max-num-seqs 1)
#                 run the captured ACL graph; totals = (prompt + generated - requests) x top-k
#   5 mc2         P restarted with PREFILL_MC2=1 and SHORT_LEN-token prompts (<= 512 tokens a pass): the MC2
#                 row rule on hardware; totals as in 2
#   6 throughput  ROUNDS x (P collect, recorder idle | P plain, flag off), interleaved, a restart each:
#                 ratio of the means with its 95% interval; PASS at >= MIN_RATIO
# SIDE=d runs checks 1, 2 (a decode-heavy load: D_IN_LEN-token prompts, D_OUT_LEN output tokens, its
# decode passes through the captured graphs and MC2; totals = (prompt + generated - requests) x top-k),
# 3 and 6 (output throughput) against d_server.sh.
# Steps that fail and what a failure means: see README.md in this folder.
# DRY_RUN=1 prints every step without running it; DRY_RUN=1 FAIL_STEP=<step> simulates that step failing.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/env.sh"
MODEL=${MODEL:-/models/DeepSeek-V3-w8a8}
SIDE=${SIDE:-p}
case "$SIDE" in
  p) SERVER=p_server.sh; URL=${P_URL:-http://127.0.0.1:${P_PORT:-8100}}; CHECKS=(audit totals native graph mc2 throughput) ;;
  d) SERVER=d_server.sh; URL=${D_URL:-http://127.0.0.1:${D_PORT:-8200}}; CHECKS=(audit totals native throughput) ;;
  *) echo "verify.sh: SIDE is p or d, got $SIDE" >&2; exit 2 ;;
esac
P_URL=$URL
N=${N:-64}; C=${C:-16}; IN_LEN=${IN_LEN:-4096}; CARDS=${CARDS:-8}; MIN_RATIO=${MIN_RATIO:-0.98}; TOLERANCE=${TOLERANCE:-0.02}
SHORT_LEN=${SHORT_LEN:-256}; MC2_CHUNK=${MC2_CHUNK:-2048}; GRAPH_OUT_LEN=${GRAPH_OUT_LEN:-16}; ROUNDS=${ROUNDS:-3}; START_TIMEOUT=${START_TIMEOUT:-3600}
D_IN_LEN=${D_IN_LEN:-1024}; D_OUT_LEN=${D_OUT_LEN:-256}
if [ "$SIDE" = d ]; then  # the recorded load, its totals and the throughput measure of each side
  RECORD_LOAD=("$D_IN_LEN" "$D_OUT_LEN"); TOTALS=(--decode); METRIC=output_throughput_per_card
else
  RECORD_LOAD=("$IN_LEN" 1); TOTALS=(); METRIC=prefill_throughput_per_card
fi
OUT=${SCENE_EPLB_DIR}/verify-$(date +%Y%m%d-%H%M%S)
DRY=${DRY_RUN:-0}
load() {  # load PROMPT_LEN OUTPUT_LEN: the bench arguments of one known load
  echo --url "$P_URL" -n "$N" -c "$C" --model "$MODEL" --input-len "$1" --output-len "$2" --cards "$CARDS" \
    --chunk-size 8192 --parallel "$(echo "$SIDE" | tr pd PD)-DP16-EP16" -q
}
FAILED=()  # the steps and checks that failed
P_PID=''

step() {  # step NAME CMD...: print, run (unless DRY_RUN), and on failure print FAIL and return 1
  local name=$1; shift
  printf '+ [%s] ' "$name"; printf '%q ' "$@"; echo
  local rc=0
  if [ "$DRY" = 1 ]; then
    if [ "${FAIL_STEP:-}" = "$name" ]; then rc=1; fi
  else
    "$@" || rc=$?
  fi
  if [ "$rc" != 0 ]; then
    echo "FAIL $name: exited $rc"
    FAILED+=("$name")
    return 1
  fi
}
skip() { echo "SKIP $1: $2"; }

start_p() {  # start_p MODE [VAR=VALUE ...]: the server in the background, up when /health answers
  stop_p
  local mode=$1; shift
  env "$@" bash "$HERE/$SERVER" "$mode" > "$OUT/$SIDE-$mode-$(date +%H%M%S).log" 2>&1 &
  P_PID=$!
  local waited=0
  until curl -sf "$P_URL/health" > /dev/null; do
    if ! kill -0 "$P_PID" 2> /dev/null; then echo "$SERVER $mode exited at startup (log in $OUT)"; P_PID=''; return 1; fi
    if [ "$waited" -ge "$START_TIMEOUT" ]; then echo "$SERVER $mode not up within $START_TIMEOUT s"; return 1; fi
    sleep 10; waited=$((waited + 10))
  done
}
stop_p() {  # stop the server this script started, and wait until it is gone
  if [ -n "$P_PID" ]; then kill "$P_PID" 2> /dev/null; wait "$P_PID" 2> /dev/null; P_PID=''; fi
  return 0
}
trap stop_p EXIT

record() {  # record TAG BENCH_ARGS...: metrics before, start, the load, stop, metrics after, dump
  local tag=$1; shift
  step "$tag-metrics-before" curl -sf "$P_URL/metrics" -o "$OUT/$tag-metrics-before.txt" &&
    step "$tag-start" scene-eplb record start --url "$P_URL" &&
    step "$tag-load" scene-eplb bench --scene "$tag" "$@" --seed 2 -o "$OUT/$tag.json" &&
    step "$tag-stop" scene-eplb record stop --url "$P_URL" &&
    step "$tag-metrics-after" curl -sf "$P_URL/metrics" -o "$OUT/$tag-metrics-after.txt" &&
    step "$tag-dump" sh -c "scene-eplb record dump --url '$P_URL' --json -q > '$OUT/$tag-dump.json'"
}
counts_of() {  # the dump file a record step wrote (a placeholder in a dry run)
  if [ "$DRY" = 1 ]; then echo "$SCENE_EPLB_DIR/dumps/counts-<role>-<export-id>.npz"; else
    python -c 'import json,sys; print(json.load(open(sys.argv[1]))["path"])' "$OUT/$1-dump.json"; fi
}

step setup mkdir -p "$OUT" || { echo "verify.sh: FAILED: setup"; exit 1; }
# shellcheck disable=SC2046  # load's words are the bench arguments
{
  # 1. audit
  if step start-collect start_p collect NATIVE_EPLB=1; then
    step audit scene-eplb audit --url "$P_URL" --recorder idle || true
    step warm-up scene-eplb bench --scene warm-up $(load "${RECORD_LOAD[@]}") --seed 1 -o "$OUT/warmup.json" || true
    # 2. totals, 3. native
    if record record $(load "${RECORD_LOAD[@]}"); then
      step totals python -m vllm_scene_eplb.client.verify totals "$(counts_of record)" "$OUT/record-metrics-before.txt" \
        "$OUT/record-metrics-after.txt" "${TOTALS[@]}" || true
      step native-load sh -c "scene-eplb record native_load --url '$P_URL' --json -q > '$OUT/native_load.json'" &&
        step native python -m vllm_scene_eplb.client.verify native "$(counts_of record)" "$OUT/native_load.json" \
          --tolerance "$TOLERANCE" || true
    else
      skip totals "the record failed"; skip native "the record failed"
    fi
    # 4. graph: decode passes through the captured graph (P; a D record is decode passes throughout)
    if [ "$SIDE" = d ]; then :
    elif record graph $(load "$IN_LEN" "$GRAPH_OUT_LEN"); then
      step graph python -m vllm_scene_eplb.client.verify totals "$(counts_of graph)" "$OUT/graph-metrics-before.txt" \
        "$OUT/graph-metrics-after.txt" --decode || true
    else
      skip graph "its record failed"
    fi
  else
    for c in "${CHECKS[@]}"; do case "$c" in mc2|throughput) ;; *) skip "$c" "the server did not start in collect mode" ;; esac; done
  fi
  # 5. mc2: short prompts with MC2 prefill (P)
  if [ "$SIDE" = d ]; then :
  elif step start-mc2 start_p collect PREFILL_MC2=1 CHUNK="$MC2_CHUNK" && record mc2 $(load "$SHORT_LEN" 1); then
    step mc2 python -m vllm_scene_eplb.client.verify totals "$(counts_of mc2)" "$OUT/mc2-metrics-before.txt" \
      "$OUT/mc2-metrics-after.txt" || true
  else
    skip mc2 "P with MC2 prefill did not start or its record failed"
  fi
  # 6. throughput: ROUNDS interleaved restarts, recorder idle vs flag off, the same load and seed
  IDLE=(); PLAIN=(); ok=1
  for r in $(seq 1 "$ROUNDS"); do
    step "round$r-start-idle" start_p collect && step "round$r-idle" scene-eplb bench --scene idle \
      $(load "${RECORD_LOAD[@]}") --seed 3 -o "$OUT/idle-$r.json" && IDLE+=("$OUT/idle-$r.json") || ok=0
    step "round$r-start-plain" start_p plain && step "round$r-plain" scene-eplb bench --scene plain \
      $(load "${RECORD_LOAD[@]}") --seed 3 -o "$OUT/plain-$r.json" && PLAIN+=("$OUT/plain-$r.json") || ok=0
  done
  stop_p
  if [ "$ok" = 1 ]; then
    step throughput python -m vllm_scene_eplb.client.verify throughput --plain "${PLAIN[@]}" --idle "${IDLE[@]}" \
      --metric "$METRIC" --min-ratio "$MIN_RATIO" || true
  else
    skip throughput "a round failed"
  fi
}
if [ "${#FAILED[@]}" = 0 ]; then
  if [ "$DRY" = 1 ]; then echo "verify.sh: dry run, nothing checked"; else echo "verify.sh: every check passed ($OUT)"; fi
  exit 0
fi
echo "verify.sh: FAILED: ${FAILED[*]} ($OUT)"
exit 1
