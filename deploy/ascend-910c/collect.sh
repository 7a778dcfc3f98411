#!/usr/bin/env bash
# The whole scene workflow of SPEC §3 for the P/D pair, against running P and D servers (both started
# in collect mode) behind a proxy:
#   audit both -> warm-up -> (cache scenes: seed, then check the cache per DP rank) -> record start on P
#   and D -> target load -> stop both -> dump both -> fit a P layout (R = REDUNDANT) and a D layout
#   (R = D_REDUNDANT, 0 by default: placement only) -> reports -> baseline A -> [restart P and D with
#   their layouts] -> audit both -> B on the same load -> compare.
# Usage: bash collect.sh            (DRY_RUN=1 prints every command without running it)
# Scene knobs (env): N, C, RATE, IN_LEN, OUT_LEN, PREFIX_SHARE, CARDS (all P + D cards), REDUNDANT,
# D_REDUNDANT, EXPERT_GROUPS (the model's n_group: env.sh's RECIPE sets it, 8 for DeepSeek-V3, 1 for V4-Flash).
# RECIPE=v4-flash-field or v4-flash-tutorial (env.sh): the V4-Flash pair; the servers run with the same RECIPE.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/env.sh"
PROXY=${PROXY_URL:-http://127.0.0.1:8000}
P_URL=${P_URL:-http://127.0.0.1:8100}
D_URL=${D_URL:-http://127.0.0.1:8200}
N=${N:-320}; C=${C:-128}; RATE=${RATE:-6}; IN_LEN=${IN_LEN:-16384}; OUT_LEN=${OUT_LEN:-1024}
PREFIX_SHARE=${PREFIX_SHARE:-0}; CARDS=${CARDS:-16}; REDUNDANT=${REDUNDANT:-16}; D_REDUNDANT=${D_REDUNDANT:-0}
OUT=${SCENE_EPLB_DIR}/scene-$(date +%Y%m%d-%H%M%S)
P_LOG=${P_LOG:-$OUT/p_server.log}; D_LOG=${D_LOG:-$OUT/d_server.log}
SCENE=(--served-model-name "$MODEL" --input-len "$IN_LEN" --output-len "$OUT_LEN" --prefix-share "$PREFIX_SHARE" --cards "$CARDS"
       --chunk-size 8192 --parallel "P-DP${P_DP}-EP$((P_DP * P_TP))+D-DP${D_DP}-EP$((D_DP * D_TP))" -q)

run() {  # print, then run unless DRY_RUN=1
  printf '+ '; printf '%q ' "$@"; echo
  if [ "${DRY_RUN:-0}" != 1 ]; then "$@"; fi
}
dump() {  # dump ROLE URL VAR: VAR = the counts file the server wrote (a placeholder in a dry run)
  printf '+ '; printf '%q ' scene-eplb record dump --url "$2" --json -q; echo
  local path="$SCENE_EPLB_DIR/dumps/counts-$1-<export-id>.npz"
  if [ "${DRY_RUN:-0}" != 1 ]; then
    path=$(scene-eplb record dump --url "$2" --json -q | python -c 'import json,sys; print(json.load(sys.stdin)["path"])')
  fi
  printf -v "$3" '%s' "$path"
}

run mkdir -p "$OUT"
# 1. both servers up with the recorder armed and idle
run scene-eplb audit --url "$P_URL" --recorder idle
run scene-eplb audit --url "$D_URL" --recorder idle
# 2. warm-up, recorders idle
run scene-eplb bench --url "$PROXY" --scene warm-up -n 32 -c 32 -r "$RATE" --seed 1 "${SCENE[@]}" -o "$OUT/warmup.json"
if [ "$PREFIX_SHARE" != 0 ]; then
  # cache scene: seed the shared prefixes on every DP rank, then check the hit rate before recording,
  # so cold prefix computation never enters the recorded (warm) distribution
  run scene-eplb bench --url "$PROXY" --scene seed -n "$((C * 2))" -c "$C" -r "$RATE" --seed 2 "${SCENE[@]}" -o "$OUT/seed.json"
  run curl -s "$P_URL/metrics" -o "$OUT/metrics-after-seed.txt"
  run grep -E 'vllm:prefix_cache_(hits|queries)' "$OUT/metrics-after-seed.txt"
fi
# 3. record only around the target load, on both sides of the pair
run scene-eplb record start --url "$P_URL"
run scene-eplb record start --url "$D_URL"
run scene-eplb bench --url "$PROXY" --scene record -n "$N" -c "$C" -r "$RATE" "${SCENE[@]}" -o "$OUT/record-load.json"
run scene-eplb record stop --url "$P_URL"
run scene-eplb record stop --url "$D_URL"
# 4. export: a Gloo SUM on each server's ranks, its rank 0 writes one checksummed file
dump prefill "$P_URL" P_COUNTS
dump decode "$D_URL" D_COUNTS
# 5. fit each side on CPU from its own counts (their hot experts differ), check, report
run scene-eplb inspect "$P_COUNTS"
run scene-eplb inspect "$D_COUNTS"
run scene-eplb fit "$P_COUNTS" --ep-size $((P_DP * P_TP)) --redundant "$REDUNDANT" --dispatch static --expert-groups "$EXPERT_GROUPS" -o "$OUT/layout-p.json"
run scene-eplb fit "$D_COUNTS" --ep-size $((D_DP * D_TP)) --redundant "$D_REDUNDANT" --dispatch static --expert-groups "$EXPERT_GROUPS" -o "$OUT/layout-d.json"
run scene-eplb report "$OUT/layout-p.json" "$P_COUNTS" -o "$OUT/report-p" -q
run scene-eplb report "$OUT/layout-d.json" "$D_COUNTS" -o "$OUT/report-d" -q
# 6. baseline A on the running (linear) pair with the recorders idle, then restart both with their layouts
run scene-eplb bench --url "$PROXY" --scene target -n "$N" -c "$C" -r "$RATE" "${SCENE[@]}" -o "$OUT/A-linear.json"
echo "restart now:  bash $HERE/p_server.sh layout $OUT/layout-p.json 2>&1 | tee $P_LOG"
echo "              bash $HERE/d_server.sh layout $OUT/layout-d.json 2>&1 | tee $D_LOG   then press Enter"
if [ "${DRY_RUN:-0}" != 1 ]; then read -r; fi
# 7. acceptance from each status route (every rank) and every worker's startup line:
#    the loaded layout is the intended one, static dispatch, recorder armed and idle
run scene-eplb audit --url "$P_URL" --log "$P_LOG" --layout "$OUT/layout-p.json" --dispatch static --recorder idle
run scene-eplb audit --url "$D_URL" --log "$D_LOG" --layout "$OUT/layout-d.json" --dispatch static --recorder idle
run scene-eplb bench --url "$PROXY" --scene target -n "$N" -c "$C" -r "$RATE" "${SCENE[@]}" -o "$OUT/B-fitted.json"
run scene-eplb compare "$OUT/A-linear.json" "$OUT/B-fitted.json" --name-a linear --name-b fitted -o "$OUT/compare"
