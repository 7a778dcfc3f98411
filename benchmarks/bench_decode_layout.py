"""A D-node layout fitted on decode counts vs vLLM's own policy (DeepSeek EPLB), on real DeepSeek-V3
decode counts, in sample and on a held-out half, measured in one run.

Geometries: EP16 with 16 slots per rank and no redundancy (the field D node: placement only) and
EP16/R16. Both sides get DeepSeek-V3's 8 routing groups. The sample file holds totals only (no
ring axis), so the holdout is a random half of the recorded assignments: every count split by a
seeded Binomial(n, 1/2) into a train half (fitted on) and a holdout half (scored on), which is
what two halves of a recording look like when assignments arrive independently. Scores are the
balancedness of the slowest rank per MoE layer (1.0 = even) under the dispatch each side fits
(``static`` with our fitted table; vLLM's policy under an even split of each expert's rows), and
with R = 0 the two are the same. Exits non-zero if a target is missed.

    python benchmarks/bench_decode_layout.py [--data DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from bench_fit_vs_vllm import DEEPSEEK_V3_GROUPS, finish, print_checks, stats, vllm_policy
from sample_data import DEFAULT

from vllm_scene_eplb.fit import FitOptions, fit_map
from vllm_scene_eplb.formats import read_counts
from vllm_scene_eplb.layouts.layout import Geometry
from vllm_scene_eplb.layouts.score import ideal_score, static_score

SCENE = "decode_in1000out1000.json"
GEOMETRIES = {"EP16/R0 (16 slots a rank, field D)": Geometry(256, 0, 16, 1), "EP16/R16": Geometry(256, 16, 16, 1)}
SEED = 20261201


def halves(w: np.ndarray, seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """A seeded binomial split of every count into (train, holdout) halves that add up to ``w``."""
    train = np.random.default_rng(seed).binomial(w.astype(np.int64), 0.5)
    return train.astype(np.float64), (w - train).astype(np.float64)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=DEFAULT, help=f"folder with {SCENE} (default {DEFAULT}; $SCENE_EPLB_DATA)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    counts = read_counts(Path(args.data) / SCENE)
    w = counts.total()[counts.active_layers()].astype(np.int64)
    train, holdout = halves(w)
    vllm = vllm_policy()
    results, failures = {}, []
    for name, g in GEOMETRIES.items():
        fits = {
            "vllm": (vllm(w.astype(np.float64), g, DEEPSEEK_V3_GROUPS), None),
            "ours": fit_map(w[None].astype(np.float64), FitOptions(g, dispatch="static", expert_groups=DEEPSEEK_V3_GROUPS)),
        }
        held = {
            "vllm": (vllm(train, g, DEEPSEEK_V3_GROUPS), None),
            "ours": fit_map(train[None], FitOptions(g, dispatch="static", expert_groups=DEEPSEEK_V3_GROUPS)),
        }
        out = {}
        print(f"\n== {name}: E={g.num_experts} R={g.num_redundant} ep={g.ep_size} (decode scene, {w.shape[0]} MoE layers)")
        print(f"{'policy':8s} {'in-sample med/worst':>22s} {'holdout med/worst':>20s}")
        for side in ("vllm", "ours"):
            score = (lambda m, src, x: ideal_score(m, x, g)) if side == "vllm" else (lambda m, src, x: static_score(m, x, g, src))
            fitted, fitted_half = fits[side], held[side]
            m, src = (fitted.map, fitted.static_sources) if side == "ours" else fitted
            mh, srch = (fitted_half.map, fitted_half.static_sources) if side == "ours" else fitted_half
            ins, ho = score(m, src, w.astype(np.float64)), score(mh, srch, holdout)
            out[side] = {"in_sample": stats(ins), "holdout": stats(ho)}
            print(f"{side:8s} {np.median(ins):13.4f}/{ins.max():.4f} {np.median(ho):11.4f}/{ho.max():.4f}")
        results[name] = out
        checks = {
            f"{where} {stat} layer ahead of vLLM": out["ours"][where][stat] < out["vllm"][where][stat]
            for where in ("in_sample", "holdout")
            for stat in ("median", "worst")
        }
        print_checks(checks, name, failures)
    return finish(results, args.json, failures)


if __name__ == "__main__":
    raise SystemExit(main())
