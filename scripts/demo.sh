#!/usr/bin/env bash
# The main job, end to end on CPU (about 8 minutes on 2 cores):
#  1. engine A/B: generate a tiny skewed Qwen3-MoE, serve it with the plugin (vLLM CPU, TP=2, EP=2),
#     record the target load, dump, fit a layout, restart with it, run the same load, compare
#     (python -m vllm_scene_eplb.rig.demo; report and summary.json in OUT/engine/report);
#  2. field geometry on real DeepSeek-V3 prefill counts: fit EP16 with 16 redundant slots, check,
#     score on another scene, export for SGLang and vLLM-Ascend, report (OUT/deepseek).
# Usage: bash scripts/demo.sh [OUT_DIR] [DEMO OPTIONS]   (default out/demo; e.g. --geometry dp2 runs the
#        engine A/B in the field geometry in miniature, DP=2 x TP=1 x EP=2; see python -m
#        vllm_scene_eplb.rig.demo --help)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
OUT=${1:-out/demo}
shift $(( $# > 0 ? 1 : 0 ))
DATA=${SCENE_EPLB_DATA:-data/deepseek_v3_counts}
VENV=${SCENE_EPLB_VENV:-.venv}
SE=("$VENV/bin/scene-eplb")
mkdir -p "$OUT/deepseek"
"$VENV/bin/python" -m vllm_scene_eplb.rig.demo --out "$OUT/engine" "$@"
set -x
"${SE[@]}" inspect "$DATA/prefill_in4096.json"
"${SE[@]}" fit "$DATA/prefill_in4096.json" --ep-size 16 --redundant 16 --dispatch static --expert-groups 8 -o "$OUT/deepseek/layout.json"
"${SE[@]}" validate "$OUT/deepseek/layout.json"
"${SE[@]}" score "$OUT/deepseek/layout.json" "$DATA/prefill_in1024.json" -q
"${SE[@]}" convert "$OUT/deepseek/layout.json" --to sglang -o "$OUT/deepseek/layout.sglang.json" -q
"${SE[@]}" convert "$OUT/deepseek/layout.json" --to vllm-ascend -o "$OUT/deepseek/expert_map.json" -q
"${SE[@]}" report "$OUT/deepseek/layout.json" "$DATA/prefill_in4096.json" -o "$OUT/deepseek/report" -q
set +x
echo "demo: engine A/B in $OUT/engine/report (summary.json, compare.md, compare.png, report.md);"
echo "      DeepSeek-V3 field-geometry layout, exports and report in $OUT/deepseek"
