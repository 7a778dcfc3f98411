#!/usr/bin/env bash
# The main job, end to end on CPU: set up, inspect real DeepSeek-V3 prefill counts, fit a layout
# for the field geometry (EP16, 16 redundant slots, static dispatch), check it, score it on the
# other scenes, export it for SGLang and vLLM-Ascend, and write a report with heat maps.
# Usage: bash scripts/demo.sh [OUT_DIR]   (default out/demo)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
OUT=${1:-out/demo}
DATA=${SCENE_EPLB_DATA:-../shared/data/deepseek_v3_counts}
SE=("${SCENE_EPLB_VENV:-.venv}/bin/scene-eplb")
mkdir -p "$OUT"
set -x
"${SE[@]}" inspect "$DATA/prefill_in4096.json"
"${SE[@]}" fit "$DATA/prefill_in4096.json" --ep-size 16 --redundant 16 --dispatch static -o "$OUT/layout.json"
"${SE[@]}" validate "$OUT/layout.json"
"${SE[@]}" score "$OUT/layout.json" "$DATA/prefill_in1024.json" -q
"${SE[@]}" convert "$OUT/layout.json" --to sglang -o "$OUT/layout.sglang.json" -q
"${SE[@]}" convert "$OUT/layout.json" --to vllm-ascend -o "$OUT/expert_map.json" -q
"${SE[@]}" report "$OUT/layout.json" "$DATA/prefill_in4096.json" -o "$OUT/report" -q
set +x
echo "demo: layout, exports and report in $OUT (open $OUT/report/report.md)"
