#!/usr/bin/env bash
# The record, fit, reload and A/B workflow for the P/D pair, against running P and D servers (both started
# in collect mode) behind a proxy:
#   audit both -> warm-up -> (cache scenes: seed every DP rank's prefix, then prove it warm from P's own
#   counters) -> record start on P and D -> target load -> stop both -> (cache scenes: the record's own hit
#   share checked) -> dump both (the measured share written into P's record) -> fit a P layout (R =
#   REDUNDANT) and a D layout (R = D_REDUNDANT, 0 by default: placement only) -> reports -> baseline A ->
#   [restart P and D with their layouts] -> audit both -> B on the same load -> compare.
# Usage: bash collect.sh            (DRY_RUN=1 prints every command without running it)
# Scene knobs (env): N, C, RATE, IN_LEN, OUT_LEN, PREFIX_SHARE (env.sh: both servers are sized and cached
# for them, so start them with the same values), SEED, CARDS (all P + D cards), REDUNDANT, D_REDUNDANT,
# WARM_MARGIN, EXPERT_GROUPS (the model's n_group: env.sh's RECIPE sets it, 8 for DeepSeek-V3, 1 for V4-Flash).
# RECIPE=v4-flash-field or v4-flash-tutorial (env.sh): the V4-Flash pair; the servers run with the same RECIPE.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/env.sh"
PROXY=${PROXY_URL:-http://127.0.0.1:8000}
P_URL=${P_URL:-http://127.0.0.1:8100}
D_URL=${D_URL:-http://127.0.0.1:8200}
N=${N:-320}; C=${C:-128}; RATE=${RATE:-6}; IN_LEN=$SCENE_IN_LEN; OUT_LEN=$SCENE_OUT_LEN; PREFIX_SHARE=$SCENE_PREFIX_SHARE
CARDS=${CARDS:-16}; REDUNDANT=${REDUNDANT:-16}; D_REDUNDANT=${D_REDUNDANT:-0}
# the loads' seed: vLLM bench draws its random prefix from the seed and N, so a cache scene's seed and check
# loads (N prompts of its prefix and one token more: only the prefix's blocks are cached) and the load they
# warm share one; the record takes SEED, the A/B arms SEED + 2 (fresh prompts on the same kind of cache)
SEED=${SEED:-0}
OUT=${SCENE_EPLB_DIR}/scene-$(date +%Y%m%d-%H%M%S)
P_LOG=${P_LOG:-$OUT/p_server.log}; D_LOG=${D_LOG:-$OUT/d_server.log}
PARALLEL=(--cards "$CARDS" --chunk-size 8192 --parallel "P-DP${P_DP}-EP$((P_DP * P_TP))+D-DP${D_DP}-EP$((D_DP * D_TP))" -q)
SCENE=(--served-model-name "$MODEL" --input-len "$IN_LEN" --output-len "$OUT_LEN" --prefix-share "$PREFIX_SHARE" "${PARALLEL[@]}")
SEED_LOAD=(--served-model-name "$MODEL" --input-len "$((PREFIX_LEN + 1))" --output-len 1 "${PARALLEL[@]}"
           --prefix-share "$(awk -v p="$PREFIX_LEN" 'BEGIN { printf "%.12f", p / (p + 1) }')")

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
warm_load() {  # warm_load SEED SCENE NAME [record]: the scene's N-prompt load of SEED (results: $OUT/NAME.json), a
  # cache scene warm first: its prefix seeded on every DP rank (N prompts spread over them), the same load
  # again proven warm from P's own counters per DP engine, and the load's own hit share checked after it
  # (under the scene's, a record is never dumped). With `record`: the recorders run around the load and
  # both sides dump (P_COUNTS, D_COUNTS), P's record carrying the hit share measured over it
  local seed=$1 tag=$2 at=$OUT/$3 record=${4:-}
  if [ "$PREFIX_LEN" -gt 0 ]; then
    run scene-eplb bench --url "$PROXY" --scene "$tag-seed" -n "$N" -c "$C" -r "$RATE" "${SEED_LOAD[@]}" --seed "$seed" -o "$at-seed.json"
    run metrics "$P_URL" "$at-metrics-0.txt"
    run scene-eplb bench --url "$PROXY" --scene "$tag-check" -n "$N" -c "$C" -r "$RATE" "${SEED_LOAD[@]}" --seed "$seed" -o "$at-check.json"
    run metrics "$P_URL" "$at-metrics-1.txt"
    run warm_check "$at-metrics-0.txt" "$at-metrics-1.txt"
  fi
  if [ -n "$record" ]; then run scene-eplb record start --url "$P_URL"; run scene-eplb record start --url "$D_URL"; fi
  run scene-eplb bench --url "$PROXY" --scene "$tag" -n "$N" -c "$C" -r "$RATE" "${SCENE[@]}" --seed "$seed" -o "$at.json"
  if [ -n "$record" ]; then run scene-eplb record stop --url "$P_URL"; run scene-eplb record stop --url "$D_URL"; fi
  if [ "$PREFIX_LEN" -gt 0 ]; then
    run metrics "$P_URL" "$at-metrics-2.txt"
    run warm_check "$at-metrics-1.txt" "$at-metrics-2.txt"
  fi
  if [ -z "$record" ]; then return 0; fi
  # export: a Gloo SUM on each server's ranks, its rank 0 writes one checksummed file
  dump prefill "$P_URL" P_COUNTS
  dump decode "$D_URL" D_COUNTS
  if [ "$PREFIX_LEN" -gt 0 ]; then run warm_check "$at-metrics-1.txt" "$at-metrics-2.txt" "$P_COUNTS"; fi
}

run mkdir -p "$OUT"
# 1. both servers up with the recorder armed and idle
run scene-eplb audit --url "$P_URL" --recorder idle
run scene-eplb audit --url "$D_URL" --recorder idle
# 2. warm-up, recorders idle (its own prompts: 32 of them, another prefix)
run scene-eplb bench --url "$PROXY" --scene warm-up -n 32 -c 32 -r "$RATE" "${SCENE[@]}" --seed "$((SEED + 1))" -o "$OUT/warmup.json"
# 3-4. record only around the target load, on both sides of the pair (a cache scene warm first), and dump both
warm_load "$SEED" record record-load record
# 5. fit each side on CPU from its own counts (their hot experts differ), check, report
run scene-eplb inspect "$P_COUNTS"
run scene-eplb inspect "$D_COUNTS"
run scene-eplb fit "$P_COUNTS" --ep-size $((P_DP * P_TP)) --redundant "$REDUNDANT" --dispatch static --expert-groups "$EXPERT_GROUPS" -o "$OUT/layout-p.json"
run scene-eplb fit "$D_COUNTS" --ep-size $((D_DP * D_TP)) --redundant "$D_REDUNDANT" --dispatch static --expert-groups "$EXPERT_GROUPS" -o "$OUT/layout-d.json"
run scene-eplb report "$OUT/layout-p.json" "$P_COUNTS" -o "$OUT/report-p" -q
run scene-eplb report "$OUT/layout-d.json" "$D_COUNTS" -o "$OUT/report-d" -q
# 6. baseline A on the running (linear) pair with the recorders idle, then restart both with their layouts
warm_load "$((SEED + 2))" target A-linear
echo "restart now:  bash $HERE/p_server.sh layout $OUT/layout-p.json 2>&1 | tee $P_LOG"
echo "              bash $HERE/d_server.sh layout $OUT/layout-d.json 2>&1 | tee $D_LOG   then press Enter"
if [ "${DRY_RUN:-0}" != 1 ]; then read -r; fi
# 7. acceptance from each status route (every rank) and every worker's startup line:
#    the loaded layout is the intended one, static dispatch, recorder armed and idle
run scene-eplb audit --url "$P_URL" --log "$P_LOG" --layout "$OUT/layout-p.json" --dispatch static --recorder idle
run scene-eplb audit --url "$D_URL" --log "$D_LOG" --layout "$OUT/layout-d.json" --dispatch static --recorder idle
warm_load "$((SEED + 2))" target B-fitted
run scene-eplb compare "$OUT/A-linear.json" "$OUT/B-fitted.json" --name-a linear --name-b fitted -o "$OUT/compare"
