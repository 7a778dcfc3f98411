"""A factorial A/B that attributes: layouts {baseline, candidate} x dispatch {static, dynamic}, on the
same load, each arm repeated and the arms interleaved (A B C D, A B C D, ...), so that a machine's
drift falls on every arm alike.

The field report could not say how much of +14.18% came from the layout and how much from the
switch to static dispatch, because only two of these four arms ran. With all four, per metric:

- **layout** effect: candidate / baseline, the geometric mean of its ratio under each dispatch;
- **dispatch** effect: static / dynamic, the geometric mean of its ratio under each layout;
- **interaction**: (candidate / baseline under static) / (candidate / baseline under dynamic):
  1 when the layout's effect does not depend on the dispatch.

Each comes with a 95% bootstrap interval (every arm's runs resampled with replacement, seeded) and a
verdict: ``positive`` (the interval lies on the better side of 1: above for throughput, below for
latency), ``negative`` (on the worse side) or ``within noise``. Pure: numpy and the result files.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import SceneEplbError
from .charts import RatioBar, ratio_chart
from .compare import LOAD_KEYS
from .results import HIGHER_IS_BETTER, METRICS, NOT_OBSERVED

LAYOUTS = ("baseline", "candidate")
DISPATCHES = ("static", "dynamic")
ARMS = tuple(f"{layout}-{dispatch}" for layout in LAYOUTS for dispatch in DISPATCHES)
EFFECTS = ("layout", "dispatch", "interaction")
BOOTSTRAP = 4000


@dataclass(frozen=True)
class Effect:
    """One effect on one metric: its ratio, the 95% bootstrap interval and the verdict."""

    ratio: float
    ci: tuple[float, float]
    verdict: str

    def to_dict(self) -> dict:
        return {**asdict(self), "ci": list(self.ci)}


def effect_ratios(means: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The three effects from each arm's mean (arrays broadcast: one value or one per bootstrap draw)."""
    bs, bd, cs, cd = (means[a] for a in ARMS)
    return {
        "layout": np.sqrt((cs / bs) * (cd / bd)),
        "dispatch": np.sqrt((bs / bd) * (cs / cd)),
        "interaction": (cs / bs) / (cd / bd),
    }


def verdict(lo: float, hi: float, higher_is_better: bool) -> str:
    """Where the interval lies against 1, read in the metric's better direction."""
    if lo > 1 or hi < 1:
        return "positive" if (lo > 1) == higher_is_better else "negative"
    return "within noise"


def effects(
    runs: dict[str, list[float]], higher_is_better: bool = True, boot: int = BOOTSTRAP, seed: int = 0
) -> dict[str, Effect]:
    """The layout, dispatch and interaction effects of one metric from every arm's run values."""
    for arm in ARMS:
        if len(runs.get(arm, ())) < 2:
            raise SceneEplbError(f"arm {arm} has {len(runs.get(arm, ()))} run(s): an interval needs at least 2 per arm")
    rng = np.random.default_rng(seed)
    point = effect_ratios({a: np.asarray(np.mean(runs[a])) for a in ARMS})
    draws = {a: rng.choice(np.asarray(runs[a], dtype=np.float64), size=(boot, len(runs[a]))).mean(axis=1) for a in ARMS}
    sampled = effect_ratios(draws)
    out = {}
    for name in EFFECTS:
        lo, hi = (float(x) for x in np.percentile(sampled[name], [2.5, 97.5]))
        out[name] = Effect(float(point[name]), (lo, hi), verdict(lo, hi, higher_is_better))
    return out


def _check_arms(results: dict[str, list[dict]]) -> None:
    """Every arm present, every run of the same load, and each arm's runs of one layout and dispatch."""
    missing = [a for a in ARMS if not results.get(a)]
    if missing:
        raise SceneEplbError(f"factorial A/B: no runs for arm(s) {missing}")
    scenes = {tuple(r["manifest"]["scene"].get(k) for k in LOAD_KEYS) for runs in results.values() for r in runs}
    if len(scenes) > 1:
        raise SceneEplbError(f"factorial A/B: the runs measure different loads (N, C, r): {sorted(scenes, key=str)}")
    hashes: dict[str, set[str]] = {}
    for arm, runs in results.items():
        knobs = {(r["manifest"].get("layout_hash"), r["manifest"].get("dispatch")) for r in runs}
        if len(knobs) > 1:
            raise SceneEplbError(f"factorial A/B: arm {arm}'s runs ran different layouts or dispatch: {sorted(knobs, key=str)}")
        ((layout_hash, dispatch),) = knobs
        if dispatch is not None and dispatch != arm.split("-")[1]:
            raise SceneEplbError(f"factorial A/B: arm {arm} ran dispatch {dispatch}")
        hashes.setdefault(arm.split("-")[0], set()).add(layout_hash)
    if any(len(h) > 1 for h in hashes.values()) or hashes["baseline"] == hashes["candidate"]:
        raise SceneEplbError(
            f"factorial A/B: each layout must be one layout on both dispatch arms, and the two must differ: {hashes}"
        )


def analyse(results: dict[str, list[dict]], primary: str = "prefill_throughput_per_card", seed: int = 0) -> dict:
    """The summary of a factorial A/B from each arm's bench results (one run each, in the order they
    ran): ``arms`` (per metric the run values and mean), ``effects`` of the ``primary`` metric
    (``layout`` / ``dispatch`` / ``interaction`` -> ``ratio``, ``ci``, ``verdict``) and ``by_metric``."""
    _check_arms(results)
    values = {m: {a: [run[m] for r in results[a] for run in r["runs"]] for a in ARMS} for m in METRICS}
    observed = [m for m in METRICS if all(NOT_OBSERVED not in v for v in values[m].values())]
    if primary not in observed:
        raise SceneEplbError(f"factorial A/B: {primary} was not observed in every run")
    by_metric = {m: {k: e.to_dict() for k, e in effects(values[m], HIGHER_IS_BETTER[m], seed=seed).items()} for m in observed}
    arms = {
        a: {
            "runs": len(values[primary][a]),
            "layout_hash": results[a][0]["manifest"].get("layout_hash"),
            "metrics": {m: {"mean": float(np.mean(values[m][a])), "values": values[m][a]} for m in observed},
        }
        for a in ARMS
    }
    return {
        "arms": arms,
        "metric": primary,
        "effects": by_metric[primary],
        "by_metric": by_metric,
        "note": "effects are ratios of arm means (geometric means over the other factor); 95% bootstrap intervals",
    }


def markdown(summary: dict) -> str:
    """The effects of every observed metric, and each arm's means, as Markdown tables."""
    lines = ["| metric | " + " | ".join(f"{e} (95% CI, verdict)" for e in EFFECTS) + " |", "|---|---|---|---|"]
    for m, eff in summary["by_metric"].items():
        lines.append(
            f"| {m} | "
            + " | ".join(
                f"{eff[e]['ratio']:.4f} [{eff[e]['ci'][0]:.4f}, {eff[e]['ci'][1]:.4f}] {eff[e]['verdict']}" for e in EFFECTS
            )
            + " |"
        )
    lines += ["", "| arm | runs | " + " | ".join(summary["by_metric"]) + " |", "|---|---|" + "---|" * len(summary["by_metric"])]
    for arm, a in summary["arms"].items():
        lines.append(
            f"| {arm} | {a['runs']} | " + " | ".join(f"{a['metrics'][m]['mean']:.4g}" for m in summary["by_metric"]) + " |"
        )
    return "\n".join(lines) + "\n"


def chart_png(summary: dict) -> bytes:
    """Each effect of each observed metric as a ratio with its interval, a line at 1.0."""
    bars = [
        RatioBar(f"{e} effect", m, eff[e]["ratio"], *eff[e]["ci"])
        for m, eff in summary["by_metric"].items()
        for e in EFFECTS
        if math.isfinite(eff[e]["ratio"])
    ]
    return ratio_chart(bars, "factorial A/B: layout, dispatch and their interaction")
