"""The factorial A/B's analysis: rounds are blocks in a recorded random order, effects come from the
within-round ratios (arms that differ read positive or negative, arms that do not read
inconclusive, and under 3 rounds nothing reads either), and arms that differ in anything but layout
and dispatch, or runs of one server start, are refused in one line."""

import json

import numpy as np
import pytest

from vllm_scene_eplb.ab.factorial import (
    ARMS,
    FIXED,
    SCENE_FIXED,
    analyse,
    chart_png,
    effects,
    markdown,
    round_orders,
)
from vllm_scene_eplb.ab.results import METRICS, NOT_OBSERVED, RESULT_FORMAT
from vllm_scene_eplb.cli import main
from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.fileio import doc_checksum
from vllm_scene_eplb.protocol import StatusAnswer

from ..conftest import worker_status

SCENE = {
    "name": "prefill-512",
    "num_prompts": 100,
    "concurrency": 8,
    "request_rate": "inf",
    "input_len": 512,
    "output_len": 4,
    "prefix_share": 0.0,
    "cards": 2,
    "seed": 0,
}
RUN = {
    "model": "tiny-moe",
    "quantization": NOT_OBSERVED,
    "role": "prefill",
    "chunk_size": 4096,
    "parallel": "DP1-TP2-EP2",
    "ep_size": 2,
    "recorder": "idle",
    "plugin_version": "0.1.0",
    "engine": "vllm 0.32.0",
}
# A value of another run for each field that must not differ between the arms.
OTHER = {
    "num_prompts": 200,
    "concurrency": 16,
    "request_rate": 4.0,
    "input_len": 1024,
    "output_len": 8,
    "prefix_share": 0.5,
    "cards": 4,
    "seed": 1,
    "model": "other-moe",
    "quantization": "fp8",
    "role": "decode",
    "chunk_size": 8192,
    "parallel": "DP2-TP1-EP2",
    "ep_size": 4,
    "recorder": "off",
    "plugin_version": "0.2.0",
    "engine": "vllm 0.33.0",
}
_starts = iter(range(10**9))


def _result(arm: str, prefill: float, ttft: float, when: float = 0.0) -> dict:
    layout, dispatch = arm.split("-")
    run = {m: NOT_OBSERVED for m in METRICS}
    run.update(prefill_throughput_per_card=prefill, ttft_p50_ms=ttft, tpot_p50_ms=0.0)
    return {
        "manifest": {
            "scene": dict(SCENE),
            **RUN,
            "layout_hash": f"{layout}-hash",
            "dispatch": dispatch,
            "server_start": f"start-{next(_starts)}",
            "recorded_unix": when,
        },
        "runs": [run],
    }


def _arms(layout_gain, dispatch_gain, rounds=4, noise=0.01, seed=0, drift=(0.0, 0.0, 0.0, 0.0)):
    """Rounds of the four arms in seeded random order; ``drift[p]`` slows the run at position p."""
    rng = np.random.default_rng(seed)
    out = {a: [] for a in ARMS}
    for r, order in enumerate(round_orders(rounds, seed)):
        for pos, arm in enumerate(order):
            layout, dispatch = arm.split("-")
            true = 1000.0 * (layout_gain if layout == "candidate" else 1.0) * (dispatch_gain if dispatch == "static" else 1.0)
            value = true * (1 + noise * rng.standard_normal()) * (1 - drift[pos])
            out[arm].append(_result(arm, value, 1e5 / value, when=10.0 * (4 * r + pos)))
    return out


def test_arms_that_differ_read_positive_and_their_ratios():
    s = analyse(_arms(layout_gain=1.20, dispatch_gain=1.05, seed=1))  # a null effect is called in 5% of seeds: not this one
    eff = s["effects"]
    assert eff["layout"]["verdict"] == "positive" and abs(eff["layout"]["ratio"] - 1.20) < 0.02
    assert eff["layout"]["ci"][0] > 1.1 and eff["layout"]["ci"][0] < eff["layout"]["ratio"] < eff["layout"]["ci"][1]
    assert eff["dispatch"]["verdict"] == "positive" and abs(eff["dispatch"]["ratio"] - 1.05) < 0.02
    assert eff["interaction"]["verdict"] == "inconclusive"  # the layout's gain is the same under both dispatches
    # a latency that falls reads positive too (lower is better)
    assert (
        s["by_metric"]["ttft_p50_ms"]["layout"]["verdict"] == "positive" and s["by_metric"]["ttft_p50_ms"]["layout"]["ratio"] < 1
    )
    assert set(s["arms"]) == set(ARMS) and all(a["runs"] == 4 for a in s["arms"].values())
    assert "tpot_p50_ms" in s["not_observed"]  # a TPOT of 0 (one output token) is no secondary metric


def test_arms_that_do_not_differ_read_inconclusive():
    s = analyse(_arms(layout_gain=1.0, dispatch_gain=1.0, noise=0.03, seed=3))
    assert {e["verdict"] for e in s["effects"].values()} == {"inconclusive"}


def test_a_worse_layout_reads_negative_and_an_interaction_shows():
    arms = _arms(layout_gain=0.9, dispatch_gain=1.0)
    for r in arms["candidate-static"]:  # the candidate loses only under dynamic dispatch: scale static back up
        r["runs"][0]["prefill_throughput_per_card"] /= 0.9
    s = analyse(arms)
    assert s["effects"]["interaction"]["verdict"] == "positive" and abs(s["effects"]["interaction"]["ratio"] - 1 / 0.9) < 0.03
    assert analyse(_arms(0.8, 1.0))["effects"]["layout"]["verdict"] == "negative"


def test_two_rounds_give_effects_but_no_verdict():
    s = analyse(_arms(layout_gain=1.5, dispatch_gain=1.0, rounds=2, noise=0.001))
    assert abs(s["effects"]["layout"]["ratio"] - 1.5) < 0.01  # the effect is there ...
    assert {e["verdict"] for m in s["by_metric"].values() for e in m.values()} == {"inconclusive"}  # ... no verdict
    assert any("2 round(s)" in w for w in s["warnings"])


def test_the_round_order_is_seeded_random_recorded_and_read_back():
    orders = round_orders(8, seed=0)
    assert all(sorted(o) == sorted(ARMS) for o in orders)
    assert len({tuple(o) for o in orders}) > 1  # varies between rounds
    assert round_orders(8, seed=0) == orders and round_orders(8, seed=1) != orders
    s = analyse(_arms(1.1, 1.0, rounds=3))
    assert s["order"] == round_orders(3, 0)  # read back from when each result was written
    fixed = _arms(1.1, 1.0, rounds=3)
    for a, docs in fixed.items():  # every round A B C D: the drift of a position falls on one arm
        for i, d in enumerate(docs):
            d["manifest"]["recorded_unix"] = 10.0 * (4 * i + ARMS.index(a))
    assert any("same order" in w for w in analyse(fixed)["warnings"])


def test_a_drift_between_positions_cancels_under_the_recorded_order():
    """300 seeded nulls at 3 rounds whose first run of a round is 8% slow, in the order ``round_orders``
    gives: the layout effect is called in about 5% of them, and on noise-free runs the drift leaves
    no effect at all. In the order A B C D every round the drift falls on baseline-static alone, and
    the dispatch effect reads a loss every time (what the varied order prevents)."""
    calls = 0
    for seed in range(300):
        rng = np.random.default_rng(seed)
        vals = {a: [] for a in ARMS}
        orders = round_orders(3, seed)
        for order in orders:
            for pos, arm in enumerate(order):
                vals[arm].append(1000 * (1 + 0.02 * rng.standard_normal()) * (0.92 if pos == 0 else 1.0))
        calls += effects(vals, order=orders)["layout"].verdict != "inconclusive"
    assert calls / 300 <= 0.08
    clean = {a: [1000 * (0.92 if o[0] == a else 1.0) for o in orders] for a in ARMS}
    assert all(abs(e.ratio - 1) < 1e-9 for e in effects(clean, order=orders).values())
    rng = np.random.default_rng(0)
    fixed = {a: [1000 * (1 + 0.005 * rng.standard_normal()) * (0.92 if a == ARMS[0] else 1) for _ in range(3)] for a in ARMS}
    assert effects(fixed, order=[list(ARMS)] * 3)["dispatch"].verdict == "negative"


@pytest.mark.parametrize("field", FIXED)
def test_arms_that_differ_in_anything_but_layout_and_dispatch_are_refused(field):
    arms = _arms(1.1, 1.0, rounds=3)
    m = arms["candidate-dynamic"][1]["manifest"]
    (m["scene"] if field in SCENE_FIXED else m)[field] = OTHER[field]
    with pytest.raises(SceneEplbError, match=f"differ in {field} ") as exc:
        analyse(arms)
    assert "\n" not in str(exc.value) and "candidate-dynamic round 2" in str(exc.value)


def test_old_manifests_read_plugin_version_from_their_server_status():
    arms = _arms(1.1, 1.0, rounds=3)
    for docs in arms.values():
        for d in docs:
            d["manifest"]["server_status"] = {"plugin_version": d["manifest"].pop("plugin_version")}
    analyse(arms)
    arms["baseline-static"][2]["manifest"]["server_status"]["plugin_version"] = "0.0.9"
    with pytest.raises(SceneEplbError, match="differ in plugin_version"):
        analyse(arms)


def test_two_rounds_in_one_server_start_are_refused():
    arms = _arms(1.1, 1.0, rounds=3)
    arms["baseline-static"][2]["manifest"]["server_start"] = arms["baseline-static"][0]["manifest"]["server_start"]
    with pytest.raises(SceneEplbError, match="baseline-static round 1 and baseline-static round 3 ran in one server start"):
        analyse(arms)


def test_a_round_without_its_server_start_is_refused():
    arms = _arms(1.1, 1.0, rounds=3)
    arms["candidate-static"][0]["manifest"]["server_start"] = NOT_OBSERVED
    with pytest.raises(SceneEplbError, match="candidate-static round 1 has no server_start"):
        analyse(arms)


def test_repeats_inside_one_server_start_are_one_observation_their_mean():
    arms = _arms(1.1, 1.0, rounds=3)
    doc = arms["candidate-static"][0]
    doc["runs"] = [dict(doc["runs"][0], prefill_throughput_per_card=v) for v in (1000.0, 1200.0)]
    assert analyse(arms)["arms"]["candidate-static"]["metrics"]["prefill_throughput_per_card"]["values"][0] == 1100.0


@pytest.mark.parametrize(
    "value, message",
    [(NOT_OBSERVED, "did not observe prefill_throughput_per_card"), (0.0, "not a positive finite number"), (None, "did not")],
    ids=["not-observed", "zero", "null"],
)
def test_a_run_without_the_primary_metric_is_one_clear_error(value, message):
    arms = _arms(1.1, 1.0, rounds=3)
    arms["baseline-dynamic"][1]["runs"][0]["prefill_throughput_per_card"] = value
    with pytest.raises(SceneEplbError, match=message) as exc:
        analyse(arms)
    assert "baseline-dynamic round 2" in str(exc.value)


def test_a_run_missing_the_primary_metric_is_one_clear_error():
    arms = _arms(1.1, 1.0, rounds=3)
    del arms["baseline-dynamic"][1]["runs"][0]["prefill_throughput_per_card"]
    with pytest.raises(SceneEplbError, match="did not observe"):
        analyse(arms)


def _one_layout(arms: dict) -> dict:
    return {a: [json.loads(json.dumps(r).replace("candidate-hash", "baseline-hash")) for r in runs] for a, runs in arms.items()}


def _recording(arms: dict) -> dict:
    for docs in arms.values():
        for d in docs:
            d["manifest"]["recorder"] = "recording"
    return arms


@pytest.mark.parametrize(
    "broken, message",
    [
        (lambda arms: {**arms, "baseline-static": arms["baseline-static"][:-1]}, "one run per round"),
        (_one_layout, "must differ"),
        (lambda arms: {a: r for a, r in arms.items() if a != "candidate-dynamic"}, "no runs for arm"),
        (_recording, "recorder was on"),
    ],
    ids=["a-round-missing", "one-layout-for-both", "an-arm-missing", "recorder-on"],
)
def test_the_runs_must_be_one_per_round_with_one_layout_and_dispatch_per_arm(broken, message):
    with pytest.raises(SceneEplbError, match=message):
        analyse(broken(_arms(1.1, 1.0)))


def test_markdown_and_chart_show_every_effect_and_the_order():
    s = analyse(_arms(1.2, 1.05))
    md = markdown(s)
    assert md.count("positive") >= 2 and "candidate-static" in md and "interaction" in md and "- round 4: " in md
    assert chart_png(s)[:8] == b"\x89PNG\r\n\x1a\n"
    two = analyse(_arms(1.2, 1.05, rounds=1))  # one round: no interval at all
    assert "[no interval]" in markdown(two) and chart_png(two)[:4] == b"\x89PNG"


def _files(tmp_path, arms) -> list[str]:
    specs = []
    for arm, docs in arms.items():
        paths = []
        for i, d in enumerate(docs):
            doc = {"format": RESULT_FORMAT, "version": 1, **d, "aggregate": {}}
            doc["checksum"] = doc_checksum(doc)
            path = tmp_path / f"{arm}-{i}.json"
            path.write_text(json.dumps(doc))
            paths.append(str(path))
        specs.append(f"{arm}={','.join(paths)}")
    return specs


def test_compare_factorial_over_saved_results(tmp_path, capsys):
    specs = _files(tmp_path, _arms(1.2, 1.0, rounds=3))
    assert main(["compare", "--factorial", *specs, "-o", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "prefill_throughput_per_card: layout 1.2" in out and "positive" in out
    saved = json.loads((tmp_path / "out" / "factorial.json").read_text())
    assert saved["order"] == round_orders(3, 0) and saved["effects"]["layout"]["verdict"] == "positive"
    assert main(["compare", "--factorial", *specs[:3]]) == 2
    assert "no results for arm(s) candidate-dynamic" in capsys.readouterr().err
    assert main(["compare", "--factorial", "bogus=x.json", *specs[1:]]) == 2
    assert "expected ARM=R1.json" in capsys.readouterr().err
    assert main(["compare", "a.json", "b.json", "--factorial", *specs]) == 2
    assert "one of them" in capsys.readouterr().err


def test_compare_factorial_refuses_another_input_length_in_one_line(tmp_path, capsys):
    arms = _arms(1.2, 1.0, rounds=3)
    arms["candidate-static"][0]["manifest"]["scene"]["input_len"] = 1024
    assert main(["compare", "--factorial", *_files(tmp_path, arms)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "differ in input_len" in err


def test_compare_factorial_plan_prints_the_seeded_order(capsys):
    assert main(["compare", "--factorial-plan", "3", "--seed", "7", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["order"] == round_orders(3, 7)


def test_bench_manifests_carry_what_the_factorial_checks():
    from vllm_scene_eplb.ab.bench import manifest
    from vllm_scene_eplb.ab.results import BenchLoad

    status = StatusAnswer.of_ranks([worker_status(0, server_start="abc"), worker_status(1, server_start="abc")])
    m = manifest(BenchLoad("s", 10, 2, float("inf"), 64, 4, cards=2), status, {"model": "m"})
    assert (m["plugin_version"], m["engine"], m["server_start"], m["recorder"]) == ("0.1.0", "vllm 0.32.0", "abc", "idle")
    assert isinstance(m["recorded_unix"], float)
    assert all(k in m or k in m["scene"] for k in FIXED)
    assert manifest(BenchLoad("s", 10, 2, float("inf"), 64, 4, cards=2), None, {})["server_start"] == NOT_OBSERVED
