"""How load changes between scenes in the real DeepSeek-V3 counts: per expert, or in blocks of ids?

For every pair of scene files and every block size b (1 = single experts, 32 = a routing group),
prints how much the mean log load ratio of a block of b neighbouring ids varies, relative to what
independent per-expert changes would give (1.0 = independent; above 1 = the block moves together).
This is the measurement behind the fitter's group hedge (``--expert-groups``). Pure numpy.

    python benchmarks/scene_structure.py [--data DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from sample_data import DEFAULT

from vllm_scene_eplb.formats import read_counts

BLOCKS = (1, 2, 4, 8, 16, 32, 64)


def block_inflation(a: np.ndarray, b: np.ndarray, block: int) -> float:
    """Variance of the per-block mean log ratio b/a, over what independent experts would give."""
    lr = np.log(b / b.mean(axis=1, keepdims=True)) - np.log(a / a.mean(axis=1, keepdims=True))
    lr -= lr.mean(axis=1, keepdims=True)
    means = lr.reshape(lr.shape[0], -1, block).mean(axis=2)
    return float(means.var() * block / lr.var())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=DEFAULT, help=f"folder of counts files (default {DEFAULT}; $SCENE_EPLB_DATA)")
    args = ap.parse_args()
    scenes = {}
    for f in sorted(Path(args.data).glob("*.json")):
        c = read_counts(f)
        scenes[f.stem] = c.total()[c.active_layers()].astype(np.float64)
    if len(scenes) < 2:
        sys.exit(f"need two or more counts files in {args.data}")
    names = list(scenes)
    print("variance of block-mean log load ratio / independent-expert prediction, by block size")
    print(f"{'scene A -> scene B':48s} " + " ".join(f"{b:>6d}" for b in BLOCKS))
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if (scenes[a] <= 0).any() or (scenes[b] <= 0).any():
                print(f"{a} -> {b}: zero counts, skipped")
                continue
            row = [block_inflation(scenes[a], scenes[b], k) for k in BLOCKS]
            print(f"{a + ' -> ' + b:48s} " + " ".join(f"{v:6.2f}" for v in row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
