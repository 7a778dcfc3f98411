"""The factorial A/B's analysis: effects and verdicts come out of the runs (arms that differ read
positive, arms that do not read within noise), and the runs must measure one load and one layout
and dispatch per arm."""

import json

import numpy as np
import pytest

from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.harness.factorial import ARMS, analyse, chart_png, effects, markdown
from vllm_scene_eplb.harness.results import METRICS, NOT_OBSERVED


def _result(arm: str, prefill: float, ttft: float, n: int = 100) -> dict:
    layout, dispatch = arm.split("-")
    run = {m: NOT_OBSERVED for m in METRICS}
    run.update(prefill_throughput_per_card=prefill, ttft_p50_ms=ttft)
    return {
        "manifest": {
            "scene": {"num_prompts": n, "concurrency": 8, "request_rate": "inf"},
            "layout_hash": f"{layout}-hash",
            "dispatch": dispatch,
        },
        "runs": [run],
    }


def _arms(layout_gain: float, dispatch_gain: float, repeats: int = 4, noise: float = 0.01, seed: int = 0) -> dict:
    """Interleaved runs (A B C D, A B C D, ...) of arms whose true throughput differs by the gains given."""
    rng = np.random.default_rng(seed)
    out = {a: [] for a in ARMS}
    for _ in range(repeats):
        for arm in ARMS:
            layout, dispatch = arm.split("-")
            true = 1000.0 * (layout_gain if layout == "candidate" else 1.0) * (dispatch_gain if dispatch == "static" else 1.0)
            value = true * (1 + noise * rng.standard_normal())
            out[arm].append(_result(arm, value, 1e5 / value))
    return out


def test_arms_that_differ_read_positive_and_their_ratios():
    s = analyse(_arms(layout_gain=1.20, dispatch_gain=1.05))
    eff = s["effects"]
    assert eff["layout"]["verdict"] == "positive" and abs(eff["layout"]["ratio"] - 1.20) < 0.02
    assert eff["layout"]["ci"][0] > 1.1 and eff["layout"]["ci"][0] < eff["layout"]["ratio"] < eff["layout"]["ci"][1]
    assert eff["dispatch"]["verdict"] == "positive" and abs(eff["dispatch"]["ratio"] - 1.05) < 0.02
    assert eff["interaction"]["verdict"] == "within noise"  # the layout's gain is the same under both dispatches
    # a latency that falls reads positive too (lower is better)
    assert (
        s["by_metric"]["ttft_p50_ms"]["layout"]["verdict"] == "positive" and s["by_metric"]["ttft_p50_ms"]["layout"]["ratio"] < 1
    )
    assert set(s["arms"]) == set(ARMS) and all(a["runs"] == 4 for a in s["arms"].values())


def test_arms_that_do_not_differ_read_within_noise():
    s = analyse(_arms(layout_gain=1.0, dispatch_gain=1.0, noise=0.03, seed=3))
    assert {e["verdict"] for e in s["effects"].values()} == {"within noise"}


def test_a_worse_layout_reads_negative_and_an_interaction_shows():
    arms = _arms(layout_gain=0.9, dispatch_gain=1.0)
    for r in arms["candidate-static"]:  # the candidate loses only under dynamic dispatch: scale static back up
        r["runs"][0]["prefill_throughput_per_card"] /= 0.9
    s = analyse(arms)
    assert s["effects"]["interaction"]["verdict"] == "positive" and abs(s["effects"]["interaction"]["ratio"] - 1 / 0.9) < 0.03
    assert effects({a: [1.0, 1.01] for a in ARMS})["layout"].verdict == "within noise"


def test_the_runs_must_measure_one_load_with_one_layout_and_dispatch_per_arm():
    arms = _arms(1.1, 1.0)
    one = {a: runs[:1] for a, runs in arms.items()}
    with pytest.raises(SceneEplbError, match="at least 2 per arm"):
        analyse(one)
    other_load = {**arms, "baseline-static": arms["baseline-static"][:-1] + [_result("baseline-static", 1000, 100, n=200)]}
    with pytest.raises(SceneEplbError, match="different loads"):
        analyse(other_load)
    same = {a: [json.loads(json.dumps(r).replace("candidate-hash", "baseline-hash")) for r in runs] for a, runs in arms.items()}
    with pytest.raises(SceneEplbError, match="must differ"):
        analyse(same)
    with pytest.raises(SceneEplbError, match="no runs for arm"):
        analyse({a: r for a, r in arms.items() if a != "candidate-dynamic"})


def test_markdown_and_chart_show_every_effect():
    s = analyse(_arms(1.2, 1.05))
    md = markdown(s)
    assert md.count("positive") >= 2 and "candidate-static" in md and "interaction" in md
    assert chart_png(s)[:8] == b"\x89PNG\r\n\x1a\n"
