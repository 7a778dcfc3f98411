"""The cost per active slot (issue 37, item 1): a rank reads the weights of every slot it computes
for, once a pass. Against a simulated device whose ranks pay a + b x assignments + c x active slots
(``harness.simulated``), advise fits c where the timing window carries its ranks' active slots and
they move apart from the assignments, prices the candidate's active slots per pass through its
dispatch, and lands on the truth; where they move together it says c is not identified and bounds
the ratio; without them it says c is unpriced."""

import numpy as np
import pytest

from vllm_scene_eplb.advise import Setup, advise
from vllm_scene_eplb.advise.model import SLOTS_PRICED, SLOTS_UNIDENTIFIED, fit_slot_model, fit_time_model
from vllm_scene_eplb.harness.simulated import Device, Scene, Server, linear_setup
from vllm_scene_eplb.layout import Geometry, Layout

from ..advise_scene import EP, SKEWED, E, candidate

DEVICE = Device(a_ms=0.05, b_ms=0.002, other_ms=3.0, c_ms=0.02)
# every layer its own skew, so the ranks' active slots move apart from their assignments across layers
VARIED = np.arange(1, E + 1)[None, :] ** -np.array([0.6, 1.0, 1.5, 2.2])[:, None]
VARIED /= VARIED.sum(axis=1, keepdims=True)


def _case(p: np.ndarray, tokens: int, capture: bool):
    s = Scene(p, tokens, 4, "decode")
    rec = s.passes(256, np.random.default_rng(1))
    srv = Server(s, DEVICE, EP, capture_active=capture)
    counts = srv.dump(rec, 1)
    cand = candidate(counts)
    answer = advise(counts, cand, "static", srv.timing_window(rec, 1))
    return answer, srv.true_ratio(cand, "static", 4096, np.random.default_rng(9))


@pytest.mark.parametrize("tokens", [16, 64])
def test_where_the_window_carries_active_slots_c_is_fitted_and_the_ratio_is_the_truth(tokens):
    answer, truth = _case(VARIED, tokens, capture=True)
    model = answer.details["model"]
    assert answer.verdict == "trial" and model["slots"] == SLOTS_PRICED, answer.reasons
    assert model["c"] == pytest.approx(DEVICE.c_ms, rel=0.05) and model["b"][0] == pytest.approx(DEVICE.b_ms, rel=0.05)
    assert abs(answer.predicted_throughput_ratio - truth) < 0.005, (answer.predicted_throughput_ratio, truth)
    assert "ms per active slot" in answer.reasons[0] and "+ c x active slots" in answer.reasons[0]
    unpriced, _ = _case(VARIED, tokens, capture=False)  # today's model: the candidate's extra slots cost nothing
    assert unpriced.predicted_throughput_ratio - truth > 0.015, (unpriced.predicted_throughput_ratio, truth)
    assert "no cost per active slot priced" in unpriced.reasons[0]


def _ratio_unpriced(details: dict) -> float:
    cycle = details["step_ms"] + details["gap_ms"]
    return cycle / (cycle - details["critical_ms_now"] + details["critical_ms_candidate"])


def test_where_active_slots_follow_the_assignments_c_is_bounded_and_the_bounds_hold_the_truth():
    """Every layer of one distribution: each layer's ranks differ in active slots as they differ in
    assignments, so the window cannot split b from c; at 16 tokens a pass the ends disagree (abstain),
    at 64 they agree and the ratio given is the end the verdict was decided at."""
    answer, truth = _case(SKEWED, 16, capture=True)
    ends = sorted((_ratio_unpriced(answer.details), answer.details["bound_ratio"]))
    assert answer.verdict == "insufficient_evidence" and answer.predicted_throughput_ratio is None, answer.reasons
    assert "not identified" in answer.reasons[0] and "lies between" in answer.reasons[-1]
    assert ends[0] < truth < ends[1], (ends, truth)
    held, truth = _case(SKEWED, 64, capture=True)
    ends = sorted((_ratio_unpriced(held.details), held.details["bound_ratio"]))
    assert held.verdict == "trial" and held.predicted_throughput_ratio == ends[0], held.reasons
    assert ends[0] < truth < ends[1] and "at both ends" in held.reasons[-2], (ends, truth)


def test_active_slots_are_the_chance_a_slot_computes_one_of_its_experts_assignments():
    """Linear layout: a slot is active exactly when its expert has an assignment. Two replicas under
    ``dynamic`` take rows in turn (min(x, 2) of 2); under ``static`` each source's share at random."""
    linear = linear_setup(4, 2, 1)
    assert linear.rank_active(np.array([[[3, 0, 1, 0]]])).tolist() == [[[1.0, 1.0]]]
    p2l = np.array([[0, 1, 2, 0, 3, 1]])  # experts 0 and 1 twice, once on each rank
    layout = Layout(p2l, Geometry(4, 2, 2), (0,))
    for dispatch, expected in (("dynamic", [0.5, 1.0, 0.0, 0.5, 0.0, 1.0]), ("static", [0.5, 0.75, 0.0, 0.5, 0.0, 0.75])):
        setup = Setup.of(layout, layout.geometry, dispatch, [0], None)
        got = setup.slot_active(np.array([[[1, 2, 0, 0]]]))[0, 0]
        assert got.tolist() == pytest.approx(expected), (dispatch, got)


def test_a_window_whose_active_slots_do_not_spread_leaves_c_unidentified_with_a_bound_from_the_fixed_cost():
    ms = np.array([[1.0, 1.2], [1.4, 1.6]])  # [ranks, L]
    n = np.array([[100.0, 100.0], [300.0, 300.0]])
    k = np.full((2, 2), 8.0)  # every slot of both ranks active
    base = fit_time_model(ms, n)
    cost = fit_slot_model(base, ms, n, k)
    assert cost.model.slots == SLOTS_UNIDENTIFIED and cost.model.c == 0 and cost.bound is not None and "hardly differ" in cost.why
    assert cost.model.b == pytest.approx([0.002, 0.002]) and cost.model.rank_ms(n.T) == pytest.approx(base.rank_ms(n.T))
    assert cost.bound.c == pytest.approx(float(cost.model.a.min()) / 8)  # the fixed cost of the cheaper layer, all per slot
    assert cost.bound.rank_ms(n.T, k.T) == pytest.approx(base.rank_ms(n.T))  # the window's own points keep their time
