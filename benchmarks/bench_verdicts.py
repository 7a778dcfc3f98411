"""How often the verdicts are wrong, measured: the factorial A/B's false-positive rate under the null and
its power, and (where ``benchmarks/verdicts_advise.py`` is built) the calibration of ``advise``.

The factorial part draws seeded A/Bs of four arms through the code the demo and ``scene-eplb compare
--factorial`` run (``ab.factorial.effects``, the block model of ``vllm_scene_eplb.ab.stats``):
each run's throughput is lognormal with ``--noise`` (5%) run-to-run, each round has a level of its
own (a bad hour: 5%), and the places in a round drift (the k-th run of a round ``--drift`` x k
slower, 3% by default: a machine that heats up, a cache that fills), which the recorded order
(``round_orders``, rows of randomised Williams squares) must cancel. Under the null the four arms
are identical; the power rows give the candidate layout a true 10% gain. For contrast it also
prints the same nulls run A B C D every round, where the drift falls on fixed arms. Pure numpy.

    python benchmarks/bench_verdicts.py [--nulls 4000] [--skip-engine]

Exit 1 when a target is missed: a layout verdict under the null in more than 6% of the nulls at 3, 5
or 8 rounds, or any at 2 rounds.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
import time

import numpy as np

from vllm_scene_eplb.ab.factorial import ARMS, effects, round_orders

ROUNDS = (2, 3, 5, 8)
TARGET_FPR = 0.06


def simulate(rounds: int, seed: int, layout_gain: float, noise: float, drift: float, fixed_order: bool) -> dict:
    """One A/B: per arm, its value in each round, and the order the rounds ran in."""
    rng = np.random.default_rng(seed)
    order = [list(ARMS)] * rounds if fixed_order else round_orders(rounds, seed)
    values: dict[str, list[float]] = {a: [0.0] * rounds for a in ARMS}
    for r, arms in enumerate(order):
        level = rng.normal(0.0, 0.05)
        for place, arm in enumerate(arms):
            gain = layout_gain if arm.startswith("candidate") else 1.0
            values[arm][r] = 1000.0 * gain * float(np.exp(level + rng.normal(0.0, noise))) * (1.0 - drift * place)
    return {"values": values, "order": order}


def rates(rounds: int, nulls: int, layout_gain: float, noise: float, drift: float, fixed_order: bool = False) -> dict:
    """Over ``nulls`` seeded A/Bs: how often the layout effect was called positive and negative, and
    the mean estimated layout ratio."""
    pos = neg = 0
    ratios = []
    for seed in range(nulls):
        ab = simulate(rounds, seed, layout_gain, noise, drift, fixed_order)
        eff = effects(ab["values"], order=ab["order"])["layout"]
        pos += eff.verdict == "positive"
        neg += eff.verdict == "negative"
        ratios.append(eff.ratio)
    return {"positive": pos / nulls, "negative": neg / nulls, "called": (pos + neg) / nulls, "mean_ratio": float(np.mean(ratios))}


def factorial_calibration(nulls: int, noise: float, drift: float) -> bool:
    print(
        f"factorial A/B: layout verdicts over {nulls} seeded A/Bs per row, {noise:.0%} run noise, 5% round levels, "
        f"a {drift:.0%}-per-place drift in each round"
    )
    print(
        "| rounds | null: called (pos / neg) | null, A B C D every round: called | power vs a true +10% | mean layout ratio (null) |"
    )
    print("|---|---|---|---|---|")
    ok = True
    for rounds in ROUNDS:
        null = rates(rounds, nulls, 1.0, noise, drift)
        fixed = rates(rounds, nulls, 1.0, noise, drift, fixed_order=True)
        power = rates(rounds, nulls, 1.10, noise, drift)
        print(
            f"| {rounds} | {null['called']:.4f} ({null['positive']:.4f} / {null['negative']:.4f}) | {fixed['called']:.4f} "
            f"| {power['positive']:.4f} | {null['mean_ratio']:.4f} |"
        )
        miss = null["called"] > 0 if rounds < 3 else null["called"] > TARGET_FPR
        if miss:
            print(f"TARGET MISSED: {rounds} rounds called the null in {null['called']:.2%} of {nulls} nulls")
        ok &= not miss
    print(f"target: at most {TARGET_FPR:.0%} at 3, 5 and 8 rounds, none at 2: {'met' if ok else 'MISSED'}")
    return ok


def advise_sections(skip_engine: bool) -> None:
    """``verdicts_advise.advise_calibration()`` and ``engine_calibration()`` (written beside this file by
    the advise calibration's author), each printed as its summary, where that file is built."""
    if importlib.util.find_spec("verdicts_advise") is None:
        print("advise calibration: not built (benchmarks/verdicts_advise.py does not exist)")
        return
    module = importlib.import_module("verdicts_advise")
    sections = [("advise calibration", module.advise_calibration)]
    if skip_engine:
        print("advise on the real CPU engine: skipped (--skip-engine)")
    else:
        sections.append(("advise on the real CPU engine", module.engine_calibration))
    for name, fn in sections:
        t0 = time.perf_counter()
        result = fn()
        shown = result.get("summary", result) if isinstance(result, dict) else result  # its summary, not every row
        print(f"{name}: {json.dumps(shown, default=str)}")
        print(f"{name}: done in {time.perf_counter() - t0:.0f}s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nulls", type=int, default=4000, help="seeded A/Bs per row (default 4000; the target needs >= 1000)")
    ap.add_argument("--noise", type=float, default=0.05, help="run-to-run noise, lognormal sd (default 0.05)")
    ap.add_argument("--drift", type=float, default=0.03, help="slowdown per place in a round (default 0.03)")
    ap.add_argument("--skip-engine", action="store_true", help="skip verdicts_advise.engine_calibration (it starts vLLM servers)")
    args = ap.parse_args()
    if args.nulls < 1000:
        ap.error("--nulls must be at least 1000 (the target is stated over >= 1000 nulls)")
    t0 = time.perf_counter()
    ok = factorial_calibration(args.nulls, args.noise, args.drift)
    print(f"factorial calibration: {time.perf_counter() - t0:.0f}s")
    advise_sections(args.skip_engine)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
