#!/usr/bin/env bash
# Acceptance of the scene_eplb recorder on a 910C P node (SIDE=p, the default) or D node (SIDE=d). It
# starts and stops that server itself (p_server.sh or d_server.sh), so run it where that server is not
# running. One PASS/FAIL line per check (SKIP only where the operator waived one, or where a step it
# needs failed: that step's FAIL makes the script exit non-zero). Every load is built to contain
# padding rows, so a mask that marks every row real fails `totals`. The checks, in order:
#   1 audit       after real traffic (the warm-up load), the server in collect mode with vLLM-Ascend's
#                 counters on: recorder idle and agreed on every rank, no skipped passes since startup
#   2 totals      a known load recorded and dumped; every MoE layer's total = the engine's own token
#                 count (vllm:prompt_tokens_total, before/after; on D plus one per decode pass and, with
#                 the MTP drafter, its verified drafts from vllm:spec_decode_num_*_tokens_total, within
#                 2 x MTP tokens a request the counters cannot see) x top-k: each real token once, no
#                 padding row, no dummy pass; the drafter's rows checked apart. P: prompts of P_LENS lengths,
#                 P_C at a time, then P_PAD_LEN-token prompts one at a time: fewer tokens than TP on the
#                 rank, which ALLTOALL pads to the TP size (the only P pass that pads: P runs eager, no
#                 DP padding; under FlashComm1, P_SEQUENCE_PARALLEL=1, the runner pads every pass to a
#                 multiple of TP and each DP rank to the largest; at TP1 no P pass pads and no such load
#                 runs). Every MoE layer of the served model's config is checked (--model), so a layer
#                 that recorded nothing fails by name, V4's hash-routed layers said apart; D: D_SEQS_PER_RANK (>= 3) sequences per DP engine, so decode batches pad
#                 to the captured graph sizes. D takes the production path where a P server answers at
#                 PAIR_P_URL (PAIR=auto; 1 insists, 0 never): the load goes through proxy.sh, D pulls each
#                 prompt's KV from P and computes its last prompt token alone (totals count those,
#                 vllm:prompt_tokens_by_source local_compute); without one a SKIP pd-path line says the
#                 D record ran local prefill on D instead
#   3 graph       (D) the record's passes replayed captured ACL graphs with padding rows: vLLM's
#                 --cudagraph-metrics tables in the D server's log between the record's start and stop
#                 (the log's size then, each taken after a stats interval, STATS_WAIT s, so the tables
#                 of the warm-up and the capture fall outside) with FULL/PIECEWISE rows with paddings
#   4 native      the same dump against vLLM-Ascend's own moe_load counters over the record (NATIVE_EPLB=1:
#                 dynamic EPLB on, algorithm interval longer than the run, so nothing moves): never above
#                 them, expert shares per layer within TOLERANCE. Counters unavailable: FAIL, unless the
#                 operator sets NATIVE_WAIVER=1 (then SKIP)
#   5 mc2         (P) restarted with PREFILL_MC2=1 (and CHUNK=MC2_CHUNK, which the preflight fits) and
#                 SHORT_LEN-token prompts: totals as in 2, and the plugin's log line proves every real
#                 pass ran MC2 (`comm`), no other comm method
#   6 throughput  ROUNDS x (collect, recorder idle | plain, flag off), interleaved (AB BA AB ...), a
#                 restart each: the within-round ratios with a 95% t interval over rounds; PASS at >= MIN_RATIO (prefill on P, output on D)
# Steps that fail and what a failure means: see README.md in this folder.
# DRY_RUN=1 prints every step without running it; DRY_RUN=1 FAIL_STEP=<step> simulates that step failing.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# Both sides without prefix caching: totals count every prompt token, and a cached one is never computed.
# D keeps its recipe's MTP drafter: the D that serves is the D accepted (totals count the verified drafts).
export PREFIX_SHARE=0
source "$HERE/env.sh"
SIDE=${SIDE:-p}
case "$SIDE" in
  p) SERVER=p_server.sh; URL=${P_URL:-http://127.0.0.1:${P_PORT:-8100}}; CHECKS=(audit totals native mc2 throughput) ;;
  d) SERVER=d_server.sh; URL=${D_URL:-http://127.0.0.1:${D_PORT:-8200}}; CHECKS=(audit totals graph native throughput) ;;
  *) echo "verify.sh: SIDE is p or d, got $SIDE" >&2; exit 2 ;;
esac
P_URL=$URL
N=${N:-64}; C=${C:-16}; IN_LEN=${IN_LEN:-4096}; CARDS=${CARDS:-8}; MIN_RATIO=${MIN_RATIO:-0.98}; TOLERANCE=${TOLERANCE:-0.02}
SHORT_LEN=${SHORT_LEN:-251}; MC2_CHUNK=${MC2_CHUNK:-2048}; ROUNDS=${ROUNDS:-3}; START_TIMEOUT=${START_TIMEOUT:-3600}
D_IN_LEN=${D_IN_LEN:-1024}; D_OUT_LEN=${D_OUT_LEN:-256}; D_SEQS_PER_RANK=${D_SEQS_PER_RANK:-3}
read -r -a P_LENS <<< "${P_LENS:-1001 2999 4093}"  # prompt lengths of P's record: no multiple of the TP size
P_C=${P_C:-2}  # P's record runs this few prompts at a time, so a pass is a few odd-length chunks
P_PAD_LEN=${P_PAD_LEN:-$((P_TP > 3 ? P_TP - 3 : P_TP - 1))}  # then prompts this short, one at a time: below TP, so ALLTOALL pads
if [ "$P_TP" = 1 ]; then P_PAD_LEN=0  # TP1: nothing pads a P pass, no such load
elif [ "$P_PAD_LEN" -lt 1 ] || [ "$P_PAD_LEN" -ge "$P_TP" ]; then
  echo "verify.sh: P_PAD_LEN $P_PAD_LEN must lie in 1-$((P_TP - 1)): ALLTOALL pads only a pass of fewer tokens than TP ($P_TP)" >&2; exit 2
fi
STATS_WAIT=${STATS_WAIT:-11}  # s: one vLLM stats interval (VLLM_LOG_STATS_INTERVAL, 10 s) and a second
PAIR=${PAIR:-auto}; PAIR_P_URL=${PAIR_P_URL:-http://${P_HOST:-127.0.0.1}:${P_PORT:-8100}}
PROXY_URL=${PROXY_URL:-http://127.0.0.1:${PROXY_PORT:-8000}}
# the recorded loads (LEN:CONCURRENCY, one bench run each), their totals (the server's speculative tokens:
# its drafter's rows are checked apart, its verified drafts counted), the throughput measure
if [ "$SIDE" = d ]; then
  RECORD_LOADS=("$D_IN_LEN:$((D_SEQS_PER_RANK * D_DP))"); OUT_LEN=$D_OUT_LEN; TOTALS=(--decode --spec-tokens "$MTP")
  METRIC=output_throughput_per_card; PARALLEL=D-DP$D_DP-TP$D_TP-EP$((D_DP * D_TP))
else
  RECORD_LOADS=(); for len in "${P_LENS[@]}"; do RECORD_LOADS+=("$len:$P_C"); done; if [ "$P_PAD_LEN" -gt 0 ]; then RECORD_LOADS+=("$P_PAD_LEN:1"); fi
  OUT_LEN=1; TOTALS=(--spec-tokens "$P_MTP"); METRIC=prefill_throughput_per_card; PARALLEL=P-DP$P_DP-TP$P_TP-EP$((P_DP * P_TP))
fi
TLEN=$IN_LEN; if [ "$SIDE" = d ]; then TLEN=$D_IN_LEN; fi  # the warm-up's and the throughput rounds' prompt length
NATIVE=(--tolerance "$TOLERANCE"); if [ "${NATIVE_WAIVER:-0}" = 1 ]; then NATIVE+=(--waive-unavailable); fi
OUT=${SCENE_EPLB_DIR}/verify-$(date +%Y%m%d-%H%M%S)
DRY=${DRY_RUN:-0}
LOAD_URL=$URL  # where the record's loads go: the server itself, or on D the P/D pair's proxy
load() {  # load PROMPT_LEN OUTPUT_LEN [CONCURRENCY]: the bench arguments of one known load
  echo --url "$LOAD_URL" -n "$N" -c "${3:-$C}" --served-model-name "$MODEL" --input-len "$1" --output-len "$2" --cards "$CARDS" \
    --chunk-size 8192 --parallel "$PARALLEL" -q
}
FAILED=()  # the steps and checks that failed
P_PID=''
P_LOG=''  # the log of the server start_p started last

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
  P_LOG="$OUT/$SIDE-$mode-$(date +%H%M%S).log"
  env "$@" bash "$HERE/$SERVER" "$mode" > "$P_LOG" 2>&1 &
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
PROXY_PID=''
stop_proxy() { if [ -n "$PROXY_PID" ]; then kill "$PROXY_PID" 2> /dev/null; wait "$PROXY_PID" 2> /dev/null; PROXY_PID=''; fi; return 0; }
start_proxy() {  # the P/D proxy in the background (P at PAIR_P_URL, D this server), up when it answers
  P_HOST=$(echo "$PAIR_P_URL" | sed -E 's#^https?://([^:/]+).*#\1#') P_PORT=$(echo "$PAIR_P_URL" | sed -E 's#.*:([0-9]+)/?$#\1#') \
    D_PORT=${D_PORT:-8200} bash "$HERE/proxy.sh" > "$OUT/proxy.log" 2>&1 &
  PROXY_PID=$!
  local waited=0
  until curl -s -o /dev/null "$PROXY_URL"; do
    if ! kill -0 "$PROXY_PID" 2> /dev/null || [ "$waited" -ge 120 ]; then echo "proxy.sh did not come up (log in $OUT)"; return 1; fi
    sleep 2; waited=$((waited + 2))
  done
}
pair_up() {  # is the P side of the pair up (PAIR=auto asks its /health; a dry run assumes not)
  case "$PAIR" in 1) return 0 ;; 0) return 1 ;; esac
  [ "$DRY" != 1 ] && curl -sf "$PAIR_P_URL/health" > /dev/null
}
mark_log() {  # mark_log FILE: after a stats interval, the size of the server's log (a bound of the record's window)
  sleep "$STATS_WAIT" && wc -c < "$P_LOG" > "$1"
}
offset_of() {  # the byte offset mark_log wrote (a placeholder in a dry run)
  if [ "$DRY" = 1 ]; then echo "<bytes>"; else cat "$1"; fi
}
trap 'stop_proxy; stop_p' EXIT

record() {  # record TAG LEN:CONCURRENCY...: metrics before, start, one bench run per load, stop, metrics after, dump
  local tag=$1 spec i=0; shift
  if [ "$SIDE" = d ]; then step "$tag-log-start" mark_log "$OUT/$tag-log-start.txt" || return 1; fi
  step "$tag-metrics-before" curl -sf "$P_URL/metrics" -o "$OUT/$tag-metrics-before.txt" &&
    step "$tag-start" scene-eplb record start --url "$P_URL" || return 1
  for spec in "$@"; do
    i=$((i + 1))
    # shellcheck disable=SC2046  # load's words are the bench arguments
    step "$tag-load$i" scene-eplb bench --scene "$tag" $(load "${spec%%:*}" "$OUT_LEN" "${spec##*:}") --seed 2 \
      -o "$OUT/$tag-$i.json" || return 1
  done
  step "$tag-stop" scene-eplb record stop --url "$P_URL" || return 1
  if [ "$SIDE" = d ]; then step "$tag-log-stop" mark_log "$OUT/$tag-log-stop.txt" || return 1; fi
  step "$tag-metrics-after" curl -sf "$P_URL/metrics" -o "$OUT/$tag-metrics-after.txt" &&
    step "$tag-dump" sh -c "scene-eplb record dump --url '$P_URL' --json -q > '$OUT/$tag-dump.json'"
}
counts_of() {  # the dump file a record step wrote (a placeholder in a dry run)
  if [ "$DRY" = 1 ]; then echo "$SCENE_EPLB_DIR/dumps/counts-<role>-<export-id>.npz"; else
    python -c 'import json,sys; print(json.load(open(sys.argv[1]))["path"])' "$OUT/$1-dump.json"; fi
}

log_of() {  # the log of the server started last (a placeholder in a dry run)
  if [ "$DRY" = 1 ]; then echo "$OUT/$SIDE-<mode>-<time>.log"; else echo "$P_LOG"; fi
}

step setup mkdir -p "$OUT" || { echo "verify.sh: FAILED: setup"; exit 1; }
# shellcheck disable=SC2046  # load's words are the bench arguments
{
  if step start-collect start_p collect NATIVE_EPLB=1; then
    step warm-up scene-eplb bench --scene warm-up $(load "$TLEN" "$OUT_LEN") --seed 1 -o "$OUT/warmup.json" || true
    # 1. audit, after real traffic
    step audit scene-eplb audit --url "$P_URL" --recorder idle || true
    # 2. totals, 3. graph (D), 4. native; D through P -> KV pull -> decode where the pair is up
    if [ "$SIDE" != d ]; then :
    elif pair_up; then
      if step start-proxy start_proxy; then LOAD_URL=$PROXY_URL; TOTALS+=(--local-prompt); fi
    else
      skip pd-path "no P server answers at $PAIR_P_URL/health: the D record runs local prefill on D, not P -> KV pull -> decode (start the pair's P, or PAIR=1)"
    fi
    if record record "${RECORD_LOADS[@]}"; then
      step totals python -m vllm_scene_eplb.ab.verify totals "$(counts_of record)" "$OUT/record-metrics-before.txt" \
        "$OUT/record-metrics-after.txt" "${TOTALS[@]}" --model "$MODEL" || true
      if [ "$SIDE" = d ]; then
        step graph python -m vllm_scene_eplb.ab.verify graph "$(log_of)" --from-byte "$(offset_of "$OUT/record-log-start.txt")" \
          --to-byte "$(offset_of "$OUT/record-log-stop.txt")" || true
      fi
      step native-load sh -c "scene-eplb record native_load --url '$P_URL' --json -q > '$OUT/native_load.json'" &&
        step native python -m vllm_scene_eplb.ab.verify native "$(counts_of record)" "$OUT/native_load.json" \
          "${NATIVE[@]}" || true
    else
      for c in totals graph native; do case "$SIDE$c" in pgraph) ;; *) skip "$c" "the record failed" ;; esac; done
    fi
    stop_proxy; LOAD_URL=$URL
  else
    for c in "${CHECKS[@]}"; do case "$c" in mc2|throughput) ;; *) skip "$c" "the server did not start in collect mode" ;; esac; done
  fi
  # 5. mc2: short prompts with MC2 prefill (P): totals, and every real pass ran MC2
  if [ "$SIDE" = d ]; then :
  elif step start-mc2 start_p collect PREFILL_MC2=1 CHUNK="$MC2_CHUNK" && record mc2 "$SHORT_LEN:$C"; then
    step mc2-totals python -m vllm_scene_eplb.ab.verify totals "$(counts_of mc2)" "$OUT/mc2-metrics-before.txt" \
      "$OUT/mc2-metrics-after.txt" "${TOTALS[@]}" --model "$MODEL" || true
    step mc2 python -m vllm_scene_eplb.ab.verify comm "$(log_of)" --want MC2 || true
  else
    skip mc2 "P with MC2 prefill did not start or its record failed"
  fi
  # 6. throughput: ROUNDS interleaved restarts, recorder idle vs flag off, the same load and seed
  IDLE=(); PLAIN=(); ok=1; TLOAD=$(load "$TLEN" "$OUT_LEN")
  # Odd rounds run idle first, even rounds plain first (AB BA AB ...), so a drift of the machine over
  # a round does not always fall on the same side of the ratio.
  for r in $(seq 1 "$ROUNDS"); do
    if [ $((r % 2)) = 1 ]; then sides="idle plain"; else sides="plain idle"; fi
    for side in $sides; do
      if [ "$side" = idle ]; then mode=collect; else mode=plain; fi
      step "round$r-start-$side" start_p "$mode" && step "round$r-$side" scene-eplb bench --scene "$side" \
        $TLOAD --seed 3 -o "$OUT/$side-$r.json" || { ok=0; continue; }
      if [ "$side" = idle ]; then IDLE+=("$OUT/idle-$r.json"); else PLAIN+=("$OUT/plain-$r.json"); fi
    done
  done
  stop_p
  if [ "$ok" = 1 ]; then
    step throughput python -m vllm_scene_eplb.ab.verify throughput --plain "${PLAIN[@]}" --idle "${IDLE[@]}" \
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
