#!/usr/bin/env bash
# The whole scene workflow of SPEC §3 against running P/D servers behind a proxy:
#   warm-up -> (cache scenes: seed, then check the cache per DP rank) -> record start -> target load
#   -> stop -> dump -> fit -> [restart P with the layout] -> audit -> A/B on the same load.
# Usage: bash collect.sh            (DRY_RUN=1 prints every command without running it)
# Scene knobs (env): N, C, RATE, IN_LEN, OUT_LEN, PREFIX_SHARE, CARDS (all P + D cards), REDUNDANT,
# EXPERT_GROUPS (the model's n_group: 8 for DeepSeek-V3/R1; 1 for models without routing groups).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/env.sh"
MODEL=${MODEL:-/models/DeepSeek-V3-w8a8}
PROXY=${PROXY_URL:-http://127.0.0.1:8000}
P_URL=${P_URL:-http://127.0.0.1:8100}
N=${N:-320}; C=${C:-128}; RATE=${RATE:-6}; IN_LEN=${IN_LEN:-16384}; OUT_LEN=${OUT_LEN:-1024}
PREFIX_SHARE=${PREFIX_SHARE:-0}; CARDS=${CARDS:-16}; REDUNDANT=${REDUNDANT:-16}; EXPERT_GROUPS=${EXPERT_GROUPS:-8}
OUT=${SCENE_EPLB_DIR}/scene-$(date +%Y%m%d-%H%M%S)
P_LOG=${P_LOG:-$OUT/p_server.log}
SCENE=(--model "$MODEL" --input-len "$IN_LEN" --output-len "$OUT_LEN" --prefix-share "$PREFIX_SHARE" --cards "$CARDS"
       --chunk-size 8192 --parallel P-DP16-EP16 -q)

run() {  # print, then run unless DRY_RUN=1
  printf '+ '; printf '%q ' "$@"; echo
  if [ "${DRY_RUN:-0}" != 1 ]; then "$@"; fi
}

run mkdir -p "$OUT"
# 1. the P server must be up with the recorder armed and idle
run scene-eplb audit --url "$P_URL" --recorder idle
# 2. warm-up, recorder off
run scene-eplb bench --url "$PROXY" --scene warm-up -n 32 -c 32 -r "$RATE" --seed 1 "${SCENE[@]}" -o "$OUT/warmup.json"
if [ "$PREFIX_SHARE" != 0 ]; then
  # cache scene: seed the shared prefixes on every DP rank, then check the hit rate before recording,
  # so cold prefix computation never enters the recorded (warm) distribution
  run scene-eplb bench --url "$PROXY" --scene seed -n "$((C * 2))" -c "$C" -r "$RATE" --seed 2 "${SCENE[@]}" -o "$OUT/seed.json"
  run curl -s "$P_URL/metrics" -o "$OUT/metrics-after-seed.txt"
  run grep -E 'vllm:prefix_cache_(hits|queries)' "$OUT/metrics-after-seed.txt"
fi
# 3. record only around the target load
run scene-eplb record start --url "$P_URL"
run scene-eplb bench --url "$PROXY" --scene record -n "$N" -c "$C" -r "$RATE" "${SCENE[@]}" -o "$OUT/record-load.json"
run scene-eplb record stop --url "$P_URL"
# 4. export: Gloo SUM on the P ranks, rank 0 writes one checksummed file
printf '+ '; printf '%q ' scene-eplb record dump --url "$P_URL" --json -q; echo
if [ "${DRY_RUN:-0}" != 1 ]; then
  COUNTS=$(scene-eplb record dump --url "$P_URL" --json -q | python -c 'import json,sys; print(json.load(sys.stdin)["path"])')
else
  COUNTS="$SCENE_EPLB_DIR/dumps/counts-prefill-<timestamp>.npz"
fi
# 5. fit on CPU, check, report
run scene-eplb inspect "$COUNTS"
run scene-eplb fit "$COUNTS" --ep-size 16 --redundant "$REDUNDANT" --dispatch static --expert-groups "$EXPERT_GROUPS" -o "$OUT/layout.json"
run scene-eplb report "$OUT/layout.json" "$COUNTS" -o "$OUT/report" -q
# 6. baseline A on the running (linear) P with the recorder off, then restart P with the layout
run scene-eplb bench --url "$PROXY" --scene target -n "$N" -c "$C" -r "$RATE" "${SCENE[@]}" -o "$OUT/A-linear.json"
echo "restart P now:  bash $HERE/p_server.sh layout $OUT/layout.json 2>&1 | tee $P_LOG   then press Enter"
if [ "${DRY_RUN:-0}" != 1 ]; then read -r; fi
# 7. acceptance from the status route (every rank) and every P worker's startup line:
#    the loaded layout is the intended one, static dispatch, recorder armed and idle
run scene-eplb audit --url "$P_URL" --log "$P_LOG" --layout "$OUT/layout.json" --dispatch static --recorder idle
run scene-eplb bench --url "$PROXY" --scene target -n "$N" -c "$C" -r "$RATE" "${SCENE[@]}" -o "$OUT/B-fitted.json"
run scene-eplb compare "$OUT/A-linear.json" "$OUT/B-fitted.json" --name-a linear --name-b fitted -o "$OUT/compare"
