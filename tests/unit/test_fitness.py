"""Live layout fitness (pure): the expected value a fit stores, windows of live counts, the drift alarm."""

import numpy as np
import pytest

from vllm_scene_eplb.fit import FitOptions, fit
from vllm_scene_eplb.layouts.counts import Counts
from vllm_scene_eplb.layouts.expected import EXPECTED_KEY, layer_scores
from vllm_scene_eplb.layouts.layout import Geometry
from vllm_scene_eplb.live.fitness import SUB_WINDOWS, DriftAlarm, LiveFitness, LiveSample

from ..conftest import skewed_counts


def _fitted(seed=0):
    counts = Counts(skewed_counts(4, 3, 16, seed=seed, tokens=4096))
    return counts, fit(counts, FitOptions(Geometry(16, 4, 4), dispatch="dynamic"))


def test_fit_stores_what_it_expects_on_its_own_scene():
    counts, layout = _fitted()
    exp = layout.meta[EXPECTED_KEY]
    per_layer = layer_scores(layout, counts.total(), layout.geometry, "dynamic")
    assert exp == {"dispatch": "dynamic", "median": float(np.median(per_layer)), "worst": float(per_layer.max())}
    assert 1.0 <= exp["median"] <= exp["worst"] < 1.05


def test_alarm_fires_after_consecutive_windows_and_clears():
    alarm = DriftAlarm(expected_median=1.0, margin=0.05, windows=2, warmup_windows=1)
    assert alarm.update(2.0) is None and not alarm.drift  # warm-up window never counts
    assert alarm.update(1.2) is None and not alarm.drift  # one window over the line
    line = alarm.update(1.3)
    assert alarm.drift and "DRIFT" in line and "30.0%" in line and "refit" in line
    assert alarm.update(1.3) is None  # still drifting: one line per change, not per window
    assert "cleared" in alarm.update(1.01) and not alarm.drift


def test_no_alarm_without_an_expectation():
    alarm = DriftAlarm(expected_median=None)
    assert all(alarm.update(9.0) is None for _ in range(10)) and not alarm.drift


def test_live_windows_use_counts_since_the_last_window_and_detect_a_new_scene():
    counts, layout = _fitted(seed=0)
    live = LiveFitness.for_server(layout, 16, 4, "dynamic", tuple(range(3)), margin=0.05, windows=2)
    same = counts.total()
    other = np.roll(same, 5, axis=1)  # the hot experts move: another scene
    total = np.zeros_like(same)
    lines = []
    for t, window in enumerate([same, same, same, other, other, other]):
        total = total + window
        lines.append(live.observe(LiveSample(total, passes=10 * (t + 1)), now=float(t)))
        if t == 2:
            assert not live.alarm.drift and abs(live.to_wire()["median"] / live.alarm.expected_median - 1) < 0.05
    d = live.to_wire()
    assert d["drift"] and d["median"] > d["threshold"] and d["passes"] == 10 and d["window_seconds"] == 1.0
    assert sum(line is not None for line in lines) == 1
    assert live.observe(LiveSample(total, passes=60), now=7.0) is None and live.windows == 6  # an idle window is skipped


def test_linear_layout_when_none_is_loaded():
    counts = Counts(skewed_counts(1, 2, 8, seed=3))
    live = LiveFitness.for_server(None, 8, 2, None, (0, 1), margin=0.05, windows=3)
    live.observe(LiveSample(counts.total(), passes=1), now=0.0)
    d = live.to_wire()
    assert d["expected_median"] is None and not d["drift"] and d["median"] >= 1.0 and len(d["per_layer"]) == 2


def test_watch_renders_a_heat_strip_and_the_drift_state():
    from vllm_scene_eplb.commands.watch import render, shade
    from vllm_scene_eplb.protocol import LiveAnswer

    counts, layout = _fitted()
    live = LiveFitness.for_server(layout, 16, 4, "dynamic", (0, 1, 2), margin=0.05, windows=1)
    assert "no live window" in render(LiveAnswer.from_wire(live.to_wire()), "http://x")
    live.observe(LiveSample(counts.total(), passes=3), now=0.0)
    wire = live.to_wire()
    assert LiveAnswer.from_wire(wire).to_wire() == wire  # the client's reader takes the server's object key for key
    text = render(LiveAnswer.from_wire(wire), "http://x")
    assert "drift     no" in text and "layers    " in text and "worst     layer" in text
    assert shade(1.0) == " " and shade(1.05) == ":" and shade(3.0) == "@"


def test_live_time_carries_the_servers_provenance_and_its_recent_windows_steps():
    from vllm_scene_eplb.live.measured import RankTime
    from vllm_scene_eplb.protocol import PROVENANCE_KEYS, TimingWindow

    said = dict(zip(PROVENANCE_KEYS, ("abc", 2, 0, "decode", "static", 16, "vllm 0.32.0", "0.1")))
    live = LiveFitness.for_server(None, 8, 2, None, (0, 1), margin=0.05, windows=3, provenance=said)
    counts = Counts(skewed_counts(1, 2, 8, seed=3)).total()
    for t in range(SUB_WINDOWS + 2):  # every window one more step of 10 ms more than the last
        times = tuple(
            RankTime(np.array([0.001, 0.002]) * (t + 1), t + 1, t + 1, 0.01 * (t + 1) * (t + 2) / 2, 0.001 * (t + 1))
            for _ in range(2)
        )
        live.observe(LiveSample(counts * (t + 1), passes=t + 1, physical=counts * (t + 1), times=times), now=float(t))
    timing = live.to_wire()["time"]
    assert timing["provenance"] == said
    assert len(timing["sub_windows"]) == SUB_WINDOWS and timing["sub_windows"][-1] == pytest.approx(10.0 * (SUB_WINDOWS + 2))
    window = TimingWindow.from_wire(timing, layers=2)
    assert window.provenance == said and window.sub_windows == tuple(timing["sub_windows"])
    assert TimingWindow.from_wire(window.to_wire()) == window
