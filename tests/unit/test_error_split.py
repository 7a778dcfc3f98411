"""The engine calibration's three-way split (issue 37 item 2): each factor moves only with its cause."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from vllm_scene_eplb.advise import advise
from vllm_scene_eplb.advise.error_split import ErrorSplit, priced_passes_ms
from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.layouts.layout import Geometry, Layout, linear_map
from vllm_scene_eplb.protocol import TimingWindow

from ..advise_scene import SKEWED, candidate, scene, server

# ranks x layers: slowest ranks 3 + 2 = 5 ms per pass, a 20 + 5 ms cycle, 40 and 20 assignments per pass
NOW = TimingWindow(((1.0, 2.0), (3.0, 1.0)), ((10.0, 10.0), (30.0, 10.0)), 20.0, {}, gap_ms=5.0)
# as predicted: slowest 2.5 + 1.5 = 4 ms, the step 1 ms shorter, the same gap and load
AS_PREDICTED = TimingWindow(((2.5, 1.5), (2.0, 1.0)), ((20.0, 8.0), (20.0, 12.0)), 19.0, {}, gap_ms=5.0)
# the model: per layer a + b x assignments, which at the candidate's window's load (40 and 20 a layer,
# split 50/50 and 40/60) gives 1 + 0.1 x 20 = 3 and 0.1 x 12 = 1.2 on the slowest ranks: 4.2 ms
DETAILS = {
    "critical_ms_now": 5.0,
    "critical_ms_candidate": 4.0,
    "timing_window_slowest_ms_modelled": 5.0,
    "candidate_rank_shares": [[0.5, 0.5], [0.4, 0.6]],
    "model": {"a": [1.0, 0.0], "b": [0.1, 0.1], "c": 0.0},
}


def test_a_candidate_that_ran_as_predicted_splits_into_no_error():
    s = ErrorSplit.of(DETAILS, NOW, AS_PREDICTED, measured=1.04)
    assert s.predicted == pytest.approx(25 / 24) and s.windows == pytest.approx(s.predicted)
    assert s.factors() == pytest.approx({"moe": 1.0, "outside": 1.0, "batch": 1.0})
    assert s.outside_now == pytest.approx(20.0) and s.outside_candidate == pytest.approx(20.0)
    assert "the A/B measured 1.040" in s.lines()[-1]
    assert s.model_errors() == pytest.approx({"now": 0.0, "candidate": 0.05})  # 4.2 modelled, 4 measured


@pytest.mark.parametrize(
    ("candidate", "moved"),
    [
        # the MoE path fell by 2 ms, not 1, and the step with it: only the MoE factor moves
        (replace(AS_PREDICTED, rank_ms=((1.5, 1.5), (1.0, 1.0)), step_ms=18.0), "moe"),
        # the same MoE change, 2 ms more between steps (outside work now on the critical path)
        (replace(AS_PREDICTED, gap_ms=7.0), "outside"),
        # the same time, a batch 10% larger
        (replace(AS_PREDICTED, rank_assignments=((22.0, 8.8), (22.0, 13.2))), "batch"),
    ],
)
def test_each_factor_moves_with_its_cause_alone(candidate, moved):
    f = ErrorSplit.of(DETAILS, NOW, candidate).factors()
    assert f.pop(moved) != pytest.approx(1.0)
    assert f == pytest.approx({k: 1.0 for k in f})


def test_an_advice_without_a_model_or_windows_of_another_model_are_refused():
    with pytest.raises(SceneEplbError, match="no time model"):
        ErrorSplit.of({"wait_share": 0.08}, NOW, AS_PREDICTED)
    with pytest.raises(SceneEplbError, match="MoE layers"):
        ErrorSplit.of(DETAILS, NOW, replace(AS_PREDICTED, rank_ms=((2.5,), (2.0,)), rank_assignments=((1.0,), (1.0,))))


def test_advises_prices_are_held_to_the_critical_paths_measured_pass_by_pass():
    plain = ErrorSplit.of(DETAILS, NOW, AS_PREDICTED)
    assert plain.price_errors() == {"now": None, "candidate": None}
    assert not any("pass by pass" in line for line in plain.lines())
    # the candidate's passes wait 5 ms for their slowest ranks, though its rank means sum to 4
    s = ErrorSplit.of(DETAILS, replace(NOW, critical_ms=5.0), replace(AS_PREDICTED, critical_ms=5.0))
    assert s.price_errors() == pytest.approx({"now": 0.0, "candidate": -0.2})
    assert "candidate 4.000 priced, 5.000 measured (-20.0%)" in s.lines()[-1]
    assert s.to_dict()["price_errors"] == pytest.approx({"now": 0.0, "candidate": -0.2})


def test_the_price_on_a_servers_own_passes_is_advises_price_on_that_dump():
    """One model, one yardstick: priced on the running dump under the running (linear) layout, the
    per-pass price is advise's own critical_ms_now; on a candidate's own dump it is what advise would
    say of the candidate at that server's load, which the split then holds to the candidate's window."""
    s = scene(SKEWED, 16)
    rec = s.passes(64, np.random.default_rng(0))
    counts = server(s).dump(rec, 1)
    window = server(s).timing_window(rec, 1)
    answer = advise(counts, candidate(counts), "static", window)
    g = candidate(counts).geometry
    linear = Layout(linear_map(Geometry(g.num_experts, 0, g.ep_size), counts.num_layers), Geometry(g.num_experts, 0, g.ep_size))
    d = answer.details
    assert priced_passes_ms(d["model"], counts, linear, "dynamic") == pytest.approx(d["critical_ms_now"])
    own = priced_passes_ms(d["model"], counts, candidate(counts), "static")
    assert own == pytest.approx(d["critical_ms_candidate"])  # the candidate on these very passes
    split = ErrorSplit.of(d, replace(window, critical_ms=5.0), replace(window, critical_ms=own * 1.1), candidate_own=own)
    assert split.price_errors()["candidate"] == pytest.approx(1 / 1.1 - 1)
    assert "priced on its own passes" in split.lines()[-1]
