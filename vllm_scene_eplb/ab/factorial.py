"""A factorial A/B that attributes: layouts {baseline, candidate} x dispatch {static, dynamic}, on the
same load, in rounds that are blocks.

The field report could not say how much of +14.18% came from the layout and how much from the
switch to static dispatch, because only two of these four arms ran. With all four, per metric and
per round (each round runs the four arms once, each run its own server start, in the order of a row
of a randomised Williams square, recorded):

- **layout** effect: candidate / baseline, the geometric mean of its ratio under each dispatch;
- **dispatch** effect: static / dynamic, the geometric mean of its ratio under each layout;
- **interaction**: (candidate / baseline under static) / (candidate / baseline under dynamic):
  1 when the layout's effect does not depend on the dispatch.

Each effect comes from the within-round log ratios, with a Student t interval over rounds and a
verdict (``stats.block_effects``: positive / negative / inconclusive; none under 3 rounds). Where
the order is known, the model also takes out the place in the round, so a drift between the
positions of a round (the first run of a round always slower, say) cancels exactly, not only on
average; an order kept the same every round cannot separate the two and is warned about. Arms that
differ in anything but the layout and the dispatch are refused, naming the field (``FIXED``), and so
are two results from one server start. Pure: numpy and the result files.
"""

from __future__ import annotations

import math
from datetime import datetime

import numpy as np

from ..errors import SceneEplbError
from .charts import RatioBar, ratio_chart
from .results import HIGHER_IS_BETTER, METRICS, NOT_OBSERVED
from .stats import MIN_ROUNDS, block_effects, check_positive

LAYOUTS = ("baseline", "candidate")
DISPATCHES = ("static", "dynamic")
ARMS = tuple(f"{layout}-{dispatch}" for layout in LAYOUTS for dispatch in DISPATCHES)
EFFECTS = ("layout", "dispatch", "interaction")
# What must be the same in every run of the four arms: the scene's fields, then the manifest's (a
# manifest without ``plugin_version`` or ``engine``, written before they were copied into it, is
# read from its ``server_status``).
SCENE_FIXED = ("num_prompts", "concurrency", "request_rate", "input_len", "output_len", "prefix_share", "cards", "seed")
RUN_FIXED = ("model", "quantization", "role", "chunk_size", "parallel", "ep_size", "recorder", "plugin_version", "engine")
FIXED = SCENE_FIXED + RUN_FIXED
SERVER_START = "server_start"


# A Williams square: a Latin square in which every arm also follows every other once (carry-over balanced).
_WILLIAMS = ((0, 1, 3, 2), (1, 2, 0, 3), (2, 3, 1, 0), (3, 0, 2, 1))
# Weights over ARMS (baseline-static, baseline-dynamic, candidate-static, candidate-dynamic) on the log scale.
CONTRASTS = {
    "layout": (-0.5, -0.5, 0.5, 0.5),
    "dispatch": (0.5, -0.5, 0.5, -0.5),
    "interaction": (-1.0, 1.0, 1.0, -1.0),
}


def round_orders(rounds: int, seed: int = 0) -> list[list[str]]:
    """The order of the four arms in each of ``rounds`` rounds: every 4 rounds the rows, in random order,
    of a Williams square with the arms randomly relabelled (seeded), so each arm runs in every place of
    a round equally often and the place can be told from the arm from 3 rounds on."""
    rng = np.random.default_rng(seed)
    out: list[list[str]] = []
    while len(out) < rounds:
        labels = rng.permutation(len(ARMS))
        out += [[ARMS[labels[i]] for i in _WILLIAMS[row]] for row in rng.permutation(len(_WILLIAMS))]
    return out[:rounds]


def positions_of(order: list[list[str]]) -> np.ndarray:
    """[rounds, arms]: where in its round each arm (in ``ARMS`` order) ran, 0 = first."""
    return np.asarray([[o.index(a) for a in ARMS] for o in order])


def effects(values: dict[str, list[float]], higher_is_better: bool = True, order=None) -> dict:
    """The layout, dispatch and interaction effects of one metric (``stats.block_effects``);
    ``values[arm][i]`` is round i's run, ``order`` (optional) each round's arms in the order they ran."""
    return effects_and_model(values, higher_is_better, order)[0]


def effects_and_model(values: dict[str, list[float]], higher_is_better: bool = True, order=None) -> tuple[dict, str]:
    """``effects`` and the block model they came from (whether it took out the place in the round)."""
    rounds = {len(values.get(a, ())) for a in ARMS}
    if len(rounds) != 1 or 0 in rounds:
        raise SceneEplbError(f"factorial A/B: every arm needs one run per round, got {[len(values.get(a, ())) for a in ARMS]}")
    logs = np.log(np.stack([check_positive(values[a], f"factorial A/B: arm {a}") for a in ARMS], axis=1))
    found, model = block_effects(
        logs, [CONTRASTS[e] for e in EFFECTS], None if order is None else positions_of(order), higher_is_better
    )
    return dict(zip(EFFECTS, found)), model


def _field(manifest: dict, key: str):
    if key in SCENE_FIXED:
        return manifest["scene"].get(key)
    if key in manifest:
        return manifest[key]
    status = manifest.get("server_status")
    return status.get(key) if isinstance(status, dict) else None


def _where(arm: str, i: int) -> str:
    return f"{arm} round {i + 1}"


def check_arms(results: dict[str, list[dict]]) -> None:
    """One run per arm and round, every run of the same load and setup (``FIXED``), its own server
    start, each arm of one layout and dispatch, and two different layouts. Raises in one line."""
    missing = [a for a in ARMS if not results.get(a)]
    if missing:
        raise SceneEplbError(f"factorial A/B: no runs for arm(s) {missing}")
    counts = [len(results[a]) for a in ARMS]
    if len(set(counts)) > 1:
        raise SceneEplbError(f"factorial A/B: every arm needs one run per round, got {dict(zip(ARMS, counts))}")
    runs = [(arm, i, doc["manifest"]) for arm in ARMS for i, doc in enumerate(results[arm])]
    ref_arm, ref_i, ref = runs[0]
    for key in FIXED:
        for arm, i, m in runs[1:]:
            if _field(m, key) != _field(ref, key):
                raise SceneEplbError(
                    f"factorial A/B: the runs differ in {key} ({_where(ref_arm, ref_i)}: {_field(ref, key)!r}, "
                    f"{_where(arm, i)}: {_field(m, key)!r}): only the layout and the dispatch may differ"
                )
    if ref.get("recorder") == "recording":
        raise SceneEplbError("factorial A/B: the recorder was on (recording) in every run: these are not measurement runs")
    starts: dict[str, str] = {}
    for arm, i, m in runs:
        start = m.get(SERVER_START)
        if not isinstance(start, str) or not start or start == NOT_OBSERVED:
            raise SceneEplbError(
                f"factorial A/B: {_where(arm, i)} has no {SERVER_START} identity (a result from before it was "
                "recorded, or a server without the plugin): a run counts only as its own server start"
            )
        if start in starts:
            raise SceneEplbError(
                f"factorial A/B: {starts[start]} and {_where(arm, i)} ran in one server start ({start}): "
                "repeats inside one start are not independent runs; restart the server for each run"
            )
        starts[start] = _where(arm, i)
    hashes: dict[str, set] = {}
    for arm in ARMS:
        knobs = {(doc["manifest"].get("layout_hash"), doc["manifest"].get("dispatch")) for doc in results[arm]}
        if len(knobs) > 1:
            raise SceneEplbError(f"factorial A/B: arm {arm}'s runs ran different layouts or dispatch: {sorted(knobs, key=str)}")
        ((layout_hash, dispatch),) = knobs
        if dispatch not in (None, NOT_OBSERVED) and dispatch != arm.split("-")[1]:
            raise SceneEplbError(f"factorial A/B: arm {arm} ran dispatch {dispatch}")
        hashes.setdefault(arm.split("-")[0], set()).add(layout_hash)
    if any(len(h) > 1 for h in hashes.values()) or hashes["baseline"] == hashes["candidate"]:
        raise SceneEplbError(
            f"factorial A/B: each layout must be one layout on both dispatch arms, and the two must differ: {hashes}"
        )


def run_value(doc: dict, metric: str, where: str, primary: bool = True):
    """One server start's value of ``metric``: the mean of its runs (repeats inside one start are one
    observation), or None when a run did not observe it. A value that is not a positive number is
    refused for the ``primary`` metric and counts as not observed for the others (a TPOT of 0 when
    one token is generated)."""
    runs = doc.get("runs")
    if not isinstance(runs, list) or not runs:
        raise SceneEplbError(f"factorial A/B: {where} holds no runs")
    values = [r.get(metric, NOT_OBSERVED) if isinstance(r, dict) else NOT_OBSERVED for r in runs]
    if any(v == NOT_OBSERVED or v is None for v in values):
        return None
    numbers = [float(v) for v in values if type(v) in (int, float)]
    if not primary and not all(math.isfinite(v) and v > 0 for v in numbers):
        return None
    if len(numbers) < len(values):
        if not primary:
            return None
        raise SceneEplbError(f"factorial A/B: {where}: {metric} is not a number ({values!r})")
    return float(check_positive(numbers, f"factorial A/B: {where}: {metric}").mean())


def _finished_at(manifest: dict) -> float | None:
    """When a run's result was written (seconds since the epoch), from its manifest, None if unknown."""
    unix = manifest.get("recorded_unix")
    if isinstance(unix, (int, float)) and not isinstance(unix, bool) and math.isfinite(unix):
        return float(unix)
    try:
        return datetime.strptime(str(manifest.get("recorded_at")), "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except ValueError:
        return None


def observed_order(results: dict[str, list[dict]]) -> list[list[str]] | None:
    """Each round's arms in the order their results were written, None where a time is missing."""
    order = []
    for i in range(len(results[ARMS[0]])):
        found = {a: _finished_at(results[a][i]["manifest"]) for a in ARMS}
        times = {a: t for a, t in found.items() if t is not None}
        if len(times) < len(ARMS):
            return None
        order.append(sorted(ARMS, key=times.__getitem__))
    return order


def analyse(results: dict[str, list[dict]], primary: str = "prefill_throughput_per_card", order=None) -> dict:
    """The summary of a factorial A/B: ``results[arm][i]`` is the bench result of ``arm`` in round i
    (each its own server start). ``order`` is each round's arms in the order they ran (default: from
    the results' times). Returns ``rounds``, ``order``, ``arms`` (per metric the values and geometric
    mean), ``effects`` of ``primary`` (``layout`` / ``dispatch`` / ``interaction`` -> ``ratio``,
    ``ci``, ``verdict``, ``rounds``, ``note``), ``by_metric``, ``not_observed`` and ``warnings``."""
    if primary not in METRICS:
        raise SceneEplbError(f"factorial A/B: unknown metric {primary!r} (one of {', '.join(METRICS)})")
    check_arms(results)
    rounds = len(results[ARMS[0]])
    values: dict[str, dict[str, list]] = {
        m: {a: [run_value(doc, m, _where(a, i), m == primary) for i, doc in enumerate(results[a])] for a in ARMS} for m in METRICS
    }
    for a in ARMS:
        for i, v in enumerate(values[primary][a]):
            if v is None:
                raise SceneEplbError(f"factorial A/B: {_where(a, i)} did not observe {primary}, the primary metric")
    observed = [m for m in METRICS if all(v is not None for vs in values[m].values() for v in vs)]
    order = order if order is not None else observed_order(results)
    if order is not None and (len(order) != rounds or any(sorted(o) != sorted(ARMS) for o in order)):
        raise SceneEplbError(f"factorial A/B: the order must list the four arms once for each of the {rounds} rounds")
    fitted = {m: effects_and_model(values[m], HIGHER_IS_BETTER[m], order) for m in observed}
    by_metric = {m: {k: e.to_dict() for k, e in eff.items()} for m, (eff, _) in fitted.items()}
    warnings = []
    if rounds < MIN_ROUNDS:
        warnings.append(f"{rounds} round(s): effects without a positive/negative verdict (it needs {MIN_ROUNDS})")
    if order is None:
        warnings.append("the order the arms ran in is not known: a drift between positions may not cancel")
    elif rounds > 1 and all(o == order[0] for o in order):
        warnings.append("every round ran the arms in the same order: a drift between positions does not cancel")
    elif "positions" not in fitted[primary][1] and rounds >= MIN_ROUNDS:
        warnings.append("the order does not separate the places in a round from the arms: a drift between them may not cancel")
    arms = {
        a: {
            "runs": rounds,
            "layout_hash": results[a][0]["manifest"].get("layout_hash"),
            "server_starts": [doc["manifest"][SERVER_START] for doc in results[a]],
            "metrics": {m: {"mean": float(np.exp(np.mean(np.log(values[m][a])))), "values": values[m][a]} for m in observed},
        }
        for a in ARMS
    }
    return {
        "rounds": rounds,
        "order": order,
        "arms": arms,
        "metric": primary,
        "model": f"log value = effects of {fitted[primary][1]} + noise",
        "effects": by_metric[primary],
        "by_metric": by_metric,
        "not_observed": [m for m in METRICS if m not in observed],
        "warnings": warnings,
        "note": "effects are geometric means of within-round ratios, one run per arm and round, each its own server "
        "start; 95% Student t intervals over rounds; no verdict under 3 rounds",
    }


def _ci_text(e: dict) -> str:
    return f"[{e['ci'][0]:.4f}, {e['ci'][1]:.4f}]" if e["ci"] else "[no interval]"


def effect_line(summary: dict) -> str:
    """The primary metric's three effects on one line."""
    return ", ".join(f"{k} {v['ratio']:.3f} {_ci_text(v)} {v['verdict']}" for k, v in summary["effects"].items())


def markdown(summary: dict) -> str:
    """The effects of every observed metric, each arm's geometric means, the order and the warnings."""
    lines = ["| metric | " + " | ".join(f"{e} (95% CI, verdict)" for e in EFFECTS) + " |", "|---|---|---|---|"]
    for m, eff in summary["by_metric"].items():
        lines.append(
            f"| {m} | " + " | ".join(f"{eff[e]['ratio']:.4f} {_ci_text(eff[e])} {eff[e]['verdict']}" for e in EFFECTS) + " |"
        )
    lines += ["", "| arm | runs | " + " | ".join(summary["by_metric"]) + " |", "|---|---|" + "---|" * len(summary["by_metric"])]
    for arm, a in summary["arms"].items():
        lines.append(
            f"| {arm} | {a['runs']} | " + " | ".join(f"{a['metrics'][m]['mean']:.4g}" for m in summary["by_metric"]) + " |"
        )
    lines.append("")
    for i, o in enumerate(summary["order"] or []):
        lines.append(f"- round {i + 1}: {' -> '.join(o)}")
    lines += [f"- warning: {w}" for w in summary["warnings"]]
    return "\n".join(lines) + "\n"


def chart_png(summary: dict) -> bytes:
    """Each effect of each observed metric as a ratio with its interval, a line at 1.0."""
    bars = [
        RatioBar(f"{e} effect", m, eff[e]["ratio"], *(eff[e]["ci"] or (None, None)))
        for m, eff in summary["by_metric"].items()
        for e in EFFECTS
    ]
    return ratio_chart(bars, "factorial A/B: layout, dispatch and their interaction")
