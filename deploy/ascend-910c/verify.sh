#!/usr/bin/env bash
# Acceptance of the scene_eplb recorder on a 910C P node, in minutes: one PASS/FAIL line per check.
#   1. the P server is up with the flag: recorder idle on every rank, every rank agrees (status route)
#   2. record a known load (N prompts of IN_LEN tokens, one output token each: prefill passes only),
#      dump it (Gloo SUM over the EP ranks, rank 0 writes one checksummed file)
#   3. every MoE layer's total = the prompt tokens the engine itself counted (vllm:prompt_tokens_total
#      on /metrics, before and after) x top-k: each real token counted once, no padding, no dummy pass
#   4. with vLLM-Ascend's dynamic EPLB on (its moe_load counters exist), the dump against those counters
#      over the same record: never above them, expert shares per layer within TOLERANCE (they also count
#      padding and idle-DP dummy rows); SKIP without dynamic EPLB
#   5. throughput: the same load with the recorder idle, then (after a restart with the flag off)
#      without the plugin; PASS when idle / off >= MIN_RATIO
# Start P first:  bash p_server.sh collect      (step 4 asks you to restart it:  bash p_server.sh plain)
# DRY_RUN=1 prints every command without running it.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/env.sh"
MODEL=${MODEL:-/models/DeepSeek-V3-w8a8}
P_URL=${P_URL:-http://127.0.0.1:8100}
N=${N:-64}; C=${C:-16}; IN_LEN=${IN_LEN:-4096}; CARDS=${CARDS:-8}; MIN_RATIO=${MIN_RATIO:-0.98}; TOLERANCE=${TOLERANCE:-0.02}
OUT=${SCENE_EPLB_DIR}/verify-$(date +%Y%m%d-%H%M%S)
LOAD=(--url "$P_URL" -n "$N" -c "$C" --model "$MODEL" --input-len "$IN_LEN" --output-len 1 --cards "$CARDS"
      --chunk-size 8192 --parallel P-DP16-EP16 -q)
FAILED=0

run() {  # print, then run unless DRY_RUN=1
  printf '+ '; printf '%q ' "$@"; echo
  if [ "${DRY_RUN:-0}" != 1 ]; then "$@"; fi
}
check() {  # a command whose exit status is the check's verdict; it prints its own PASS/FAIL line
  printf '+ '; printf '%q ' "$@"; echo
  if [ "${DRY_RUN:-0}" != 1 ]; then "$@" || FAILED=1; fi
}

run mkdir -p "$OUT"
# 1. flag on, recorder idle and agreed on every rank
check scene-eplb audit --url "$P_URL" --recorder idle
# warm the server (compiles, caches) with the recorder idle
run scene-eplb bench --scene warm-up "${LOAD[@]}" --seed 1 -o "$OUT/warmup.json"
# 2. record a known load, nothing else running against P
run curl -sf "$P_URL/metrics" -o "$OUT/metrics-before.txt"
run scene-eplb record start --url "$P_URL"
run scene-eplb bench --scene record "${LOAD[@]}" --seed 2 -o "$OUT/record.json"
run scene-eplb record stop --url "$P_URL"
run curl -sf "$P_URL/metrics" -o "$OUT/metrics-after.txt"
printf '+ '; printf '%q ' scene-eplb record dump --url "$P_URL" --json -q; echo
if [ "${DRY_RUN:-0}" != 1 ]; then
  COUNTS=$(scene-eplb record dump --url "$P_URL" --json -q | python -c 'import json,sys; print(json.load(sys.stdin)["path"])')
else
  COUNTS="$SCENE_EPLB_DIR/dumps/counts-prefill-<export-id>.npz"
fi
# 3. every layer counted each prompt token top-k times
check scene-eplb inspect "$COUNTS" -q
check python -m vllm_scene_eplb.client.verify totals "$COUNTS" "$OUT/metrics-before.txt" "$OUT/metrics-after.txt"
# 4. against vLLM-Ascend's own counters over the same record (SKIP without its dynamic EPLB)
printf '+ '; printf '%q ' scene-eplb record native_load --url "$P_URL" --json -q; echo
if [ "${DRY_RUN:-0}" != 1 ]; then scene-eplb record native_load --url "$P_URL" --json -q > "$OUT/native_load.json"; fi
check python -m vllm_scene_eplb.client.verify native "$COUNTS" "$OUT/native_load.json" --tolerance "$TOLERANCE"
# 5. throughput, recorder idle vs flag off (same load, same seed)
run scene-eplb bench --scene idle "${LOAD[@]}" --seed 3 -o "$OUT/idle.json"
echo "restart P without the plugin now:  bash $HERE/p_server.sh plain   then press Enter"
if [ "${DRY_RUN:-0}" != 1 ]; then read -r; fi
run scene-eplb bench --scene plain "${LOAD[@]}" --seed 3 -o "$OUT/plain.json"
check python -m vllm_scene_eplb.client.verify throughput "$OUT/plain.json" "$OUT/idle.json" --min-ratio "$MIN_RATIO"
if [ "${DRY_RUN:-0}" = 1 ]; then echo "verify.sh: dry run, nothing checked"; exit 0; fi
if [ "$FAILED" = 0 ]; then echo "verify.sh: every check passed ($OUT)"; else echo "verify.sh: a check FAILED ($OUT)"; exit 1; fi
