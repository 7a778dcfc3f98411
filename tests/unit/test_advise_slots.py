"""The cost per active slot (issue 37, item 1): a rank reads the weights of every slot it computes
for, once a pass. Against a simulated device whose ranks pay a + b x assignments + c x active slots
(``rig.simulated``), advise fits c where the timing window carries its ranks' active slots and
they move apart from the assignments, prices the candidate's active slots per pass through its
dispatch, and lands on the truth; where they move together it says c is not identified and bounds
the ratio; without them it says c is unpriced."""

from dataclasses import replace

import numpy as np
import pytest

from vllm_scene_eplb.advise import Setup, advise
from vllm_scene_eplb.advise.gates import MAX_WAIT_SHARE, sub_window_spread
from vllm_scene_eplb.advise.model import SLOTS_PRICED, SLOTS_UNIDENTIFIED, fit_slot_model, fit_time_model
from vllm_scene_eplb.layouts.layout import Geometry, Layout
from vllm_scene_eplb.protocol import PassGroup, TimingWindow
from vllm_scene_eplb.rig.simulated import Device, Server, SimulatedTraffic, linear_setup

from ..advise_scene import EP, SKEWED, E, candidate

DEVICE = Device(a_ms=0.05, b_ms=0.002, other_ms=3.0, c_ms=0.02)
# every layer its own skew, so the ranks' active slots move apart from their assignments across layers
VARIED = np.arange(1, E + 1)[None, :] ** -np.array([0.6, 1.0, 1.5, 2.2])[:, None]
VARIED /= VARIED.sum(axis=1, keepdims=True)


def _case(p: np.ndarray, tokens: int, capture: bool):
    s = SimulatedTraffic(p, tokens, 4, "decode")
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


def _group(tokens, passes: int, ms, n, k) -> PassGroup:
    as_rows = lambda m: tuple(tuple(float(x) for x in row) for row in np.asarray(m))  # noqa: E731
    return PassGroup(tokens, passes, as_rows(ms), as_rows(n), as_rows(k))


def test_where_the_ranks_active_slots_follow_their_assignments_the_pass_size_groups_pin_c_down():
    """Two ranks whose active slots differ as their assignments do in every layer, and two pass sizes: small passes about one assignment per active slot, large ones every slot active
    with many. Across the ranks c is not identified; across the groups it is, and it is the truth."""
    a, b, c = np.array([0.1, 0.3]), 0.002, 0.02
    # [ranks, L], the layers alike but for their fixed cost: within every layer the ranks differ alike
    small_n, small_k = np.array([[6.0, 6.0], [2.0, 2.0]]), np.array([[5.0, 5.0], [2.0, 2.0]])
    large_n, large_k = np.array([[300.0, 300.0], [100.0, 100.0]]), np.array([[16.0, 16.0], [15.0, 15.0]])
    ms = lambda n, k: a[None, :] + b * n + c * k  # noqa: E731
    groups = (
        _group((0, 8), 30, ms(small_n, small_k), small_n, small_k),
        _group((64, 512), 10, ms(large_n, large_k), large_n, large_k),
    )
    n, k = (30 * small_n + 10 * large_n) / 40, (30 * small_k + 10 * large_k) / 40
    base = fit_time_model(ms(n, k), n)
    across_ranks = fit_slot_model(base, ms(n, k), n, k)
    assert across_ranks.model.slots == SLOTS_UNIDENTIFIED and "no pass-size groups" in across_ranks.why
    across_passes = fit_slot_model(base, ms(n, k), n, k, groups)
    assert across_passes.model.slots == SLOTS_PRICED and across_passes.bound is None, across_passes.why
    assert across_passes.model.c == pytest.approx(c) and across_passes.model.b == pytest.approx([b, b])
    assert across_passes.model.a == pytest.approx(a) and "2 pass-size groups x 2 ranks" in across_passes.why
    one_size = fit_slot_model(base, ms(n, k), n, k, groups[:1])  # one group: nothing across passes
    assert one_size.model.slots == SLOTS_UNIDENTIFIED


def test_advise_prices_c_from_the_pass_size_groups_of_a_window_whose_ranks_cannot():
    """A simulated server serving passes of 16 and of 256 tokens of one distribution in every layer:
    its window (read back through the protocol's checks) prices c at the device's with its groups,
    and bounds it without them."""
    srv = Server(SimulatedTraffic(SKEWED, 16, 4, "decode"), DEVICE, EP, capture_active=True)
    rng = np.random.default_rng(3)
    parts = [(SimulatedTraffic(SKEWED, tokens, 4, "decode"), count) for tokens, count in ((16, 192), (256, 64))]
    recs = [s.passes(count, rng) for s, count in parts]
    windows = [replace(srv, scene=s).timing_window(rec, 1) for (s, _), rec in zip(parts, recs)]
    weights = np.array([192.0, 64.0]) / 256

    def mean(key: str) -> tuple:
        return tuple(tuple(map(float, row)) for row in sum(w * np.asarray(getattr(x, key)) for w, x in zip(weights, windows)))

    groups = tuple(
        _group(bounds, count, x.rank_ms, x.rank_assignments, x.rank_active_slots)
        for bounds, count, x in zip(((8, 64), (64, 512)), (192, 64), windows)
    )
    rec = np.concatenate(recs)
    window = replace(
        windows[0],
        rank_ms=mean("rank_ms"),
        rank_assignments=mean("rank_assignments"),
        rank_active_slots=mean("rank_active_slots"),
        step_ms=float(weights @ [x.step_ms for x in windows]),
        pass_groups=groups,
    )
    window = TimingWindow.from_wire(window.to_wire())  # the groups as the protocol checks them
    counts = replace(srv, scene=SimulatedTraffic(SKEWED, 64, 4, "decode")).dump(rec, 1)  # 64 tokens a pass on average
    cand = candidate(counts)
    priced = advise(counts, cand, "static", window).details["model"]
    assert priced["slots"] == SLOTS_PRICED and priced["c"] == pytest.approx(DEVICE.c_ms, rel=0.05), priced
    assert priced["b"][0] == pytest.approx(DEVICE.b_ms, rel=0.05)
    bounded = advise(counts, cand, "static", replace(window, pass_groups=())).details["model"]
    assert bounded["slots"] == SLOTS_UNIDENTIFIED


def test_a_window_whose_ranks_waited_on_a_run_queue_abstains_naming_it():
    s = SimulatedTraffic(VARIED, 64, 4, "decode")
    rec = s.passes(256, np.random.default_rng(1))
    srv = Server(s, DEVICE, EP, capture_active=True)
    counts = srv.dump(rec, 1)
    cand = candidate(counts)
    window = srv.timing_window(rec, 1)
    for share, verdict in ((None, "trial"), (0.0, "trial"), (MAX_WAIT_SHARE, "trial"), (0.08, "insufficient_evidence")):
        answer = advise(counts, cand, "static", replace(window, wait_share=share))
        assert answer.verdict == verdict and answer.details["wait_share"] == share, (share, answer.reasons)
    busy = advise(counts, cand, "static", replace(window, wait_share=0.08))
    assert busy.predicted_throughput_ratio is None and "wait_share" in busy.reasons[-1] and "8.0%" in busy.reasons[-1]
    assert busy.details["max_wait_share"] == MAX_WAIT_SHARE
    trial = advise(counts, cand, "static", window)  # the abstention still says what the model would have
    assert busy.details["critical_ms_candidate"] == trial.details["critical_ms_candidate"] < trial.details["critical_ms_now"]


def test_a_cold_first_sub_window_does_not_set_the_noise_floor():
    """The engine's sub-windows after a start: the first holds the warm-up. Twice their plain
    coefficient of variation reads 0.99; the oldest dropped and a robust spread, 3.5%."""
    cold = (907.8, 399.3, 373.1, 369.1, 364.3)
    spread, source = sub_window_spread(cold)
    assert 2 * spread == pytest.approx(0.0352, abs=5e-4) and "the oldest dropped" in source and "median absolute" in source
    assert 2 * np.std(cold, ddof=1) / np.mean(cold) > 0.9  # what the floor was
    assert sub_window_spread(cold[:2]) is None and sub_window_spread(cold[2:])[1].endswith("step time")  # 3: none dropped
    s = SimulatedTraffic(VARIED, 64, 4, "decode")
    rec = s.passes(256, np.random.default_rng(1))
    srv = Server(s, DEVICE, EP, capture_active=True)
    counts = srv.dump(rec, 1)
    window = srv.timing_window(rec, 1)
    answer = advise(
        counts, candidate(counts), "static", replace(window, sub_windows=tuple(x / 370 * window.step_ms for x in cold))
    )
    assert answer.verdict == "trial" and answer.details["noise_floor"] == pytest.approx(0.0352, abs=5e-4), answer.details
    assert "the oldest dropped" in answer.details["noise_floor_source"]
