"""The one statistics module: the t quantile against published tables, the effect's interval and
verdicts, and its false-positive rate under the null measured on seeded nulls."""

import math

import numpy as np
import pytest

from vllm_scene_eplb.ab.stats import MIN_ROUNDS, betainc, block_effects, check_positive, t_cdf, t_quantile
from vllm_scene_eplb.errors import SceneEplbError

# Student t two-sided 95% (0.975 quantile) and 99% (0.995), from published tables.
T_TABLE = {
    1: (12.7062, 63.6567),
    2: (4.3027, 9.9248),
    3: (3.1824, 5.8409),
    4: (2.7764, 4.6041),
    5: (2.5706, 4.0321),
    7: (2.3646, 3.4995),
    10: (2.2281, 3.1693),
    30: (2.0423, 2.7500),
    120: (1.9799, 2.6174),
}


def effect(log_ratios, higher_is_better=True):
    """One contrast of two arms whose within-round log ratios are ``log_ratios`` (the paired case)."""
    x = np.asarray(log_ratios, dtype=np.float64)
    (e,), _ = block_effects(np.stack([np.zeros_like(x), x], axis=1), [(-1.0, 1.0)], higher_is_better=higher_is_better)
    return e


@pytest.mark.parametrize("df", sorted(T_TABLE))
def test_t_quantile_matches_the_tables(df):
    q975, q995 = T_TABLE[df]
    assert t_quantile(0.975, df) == pytest.approx(q975, abs=1e-4)
    assert t_quantile(0.995, df) == pytest.approx(q995, abs=1e-4)
    assert t_quantile(0.025, df) == pytest.approx(-q975, abs=1e-4)  # symmetric


def test_t_cdf_and_betainc_known_values():
    assert t_cdf(0.0, 3) == pytest.approx(0.5)
    assert t_cdf(1.0, 1) == pytest.approx(0.75)  # Cauchy: 1/2 + atan(1)/pi
    assert t_cdf(-2.0, 2) == pytest.approx(0.5 * (1 - 2 / math.sqrt(6)))  # closed form at df=2
    assert betainc(2, 3, 0.4) == pytest.approx(0.5248)  # I_0.4(2, 3) = 1 - 0.6^4 - 4 x 0.4 x 0.6^3
    assert betainc(0.5, 0.5, 0.25) == pytest.approx(2 / math.pi * math.asin(0.5))  # arcsine law
    assert t_quantile(0.975, 1e6) == pytest.approx(1.95996, abs=1e-4)  # the normal at large df


def test_effect_interval_is_the_t_interval_of_the_log_ratios():
    x = np.log([1.10, 1.12, 1.08, 1.11])
    e = effect(x)
    half = 3.1824 * x.std(ddof=1) / 2
    assert e.ratio == pytest.approx(math.exp(x.mean()))
    assert e.ci == pytest.approx((math.exp(x.mean() - half), math.exp(x.mean() + half)), rel=1e-4)
    assert e.verdict == "positive" and e.rounds == 4
    assert effect(x, higher_is_better=False).verdict == "negative"  # a latency that rose
    assert effect(-x).verdict == "negative"
    assert effect(np.log([1.1, 0.9, 1.0])).verdict == "inconclusive"


def test_fewer_than_three_rounds_give_no_verdict():
    assert MIN_ROUNDS == 3
    two = effect(np.log([1.5, 1.5001]))  # a tight interval far above 1, but only 2 rounds
    assert two.ci is not None and two.ci[0] > 1.4 and two.verdict == "inconclusive" and "2 rounds" in two.note
    one = effect(np.log([1.5]))
    assert one.ci is None and one.verdict == "inconclusive" and one.ratio == pytest.approx(1.5) and one.dof == 0


@pytest.mark.parametrize("bad", [[0.0, 1.0], [float("nan"), 1.0], [-1.0, 2.0], [float("inf"), 1.0]])
def test_values_that_are_no_evidence_are_refused_in_one_line(bad):
    with pytest.raises(SceneEplbError, match="not a positive finite number"):
        check_positive(bad, "arm x")
    with pytest.raises(SceneEplbError, match="one finite log value per round and arm"):
        effect([0.1, float("nan"), 0.2])


@pytest.mark.parametrize("rounds", [3, 5])
def test_false_positive_rate_under_the_null_is_at_its_level(rounds):
    """500 seeded nulls of normal log noise: the rate of positive/negative is 5% +- sampling error
    (binomial sd 1%): a z interval in place of t, or a bootstrap, would read 15-25% at 3 rounds."""
    rng = np.random.default_rng(rounds)
    calls = sum(effect(rng.normal(0, 0.05, rounds)).verdict != "inconclusive" for _ in range(500))
    assert calls / 500 <= 0.08
    assert calls / 500 >= 0.02  # and not a test that never speaks


def _four_arm_null(rng, rounds, drift, orders):
    """log values [rounds, 4] of four identical arms with 5% noise, the run at place p slowed by drift[p]."""
    pos = np.asarray([[o.index(a) for a in range(4)] for o in orders])
    return rng.normal(0, 0.05, (rounds, 4)) + np.log1p(-np.asarray(drift))[pos], pos


LAYOUT = [(-0.5, -0.5, 0.5, 0.5)]


def test_a_drift_between_places_in_a_round_is_taken_out_by_the_position_term():
    """3 rounds of a Latin square whose first run of each round is 10% slow: the first place holds two
    baseline runs and one candidate run, so without the place in the model the layout effect is off
    by ~1.7%; with it the drift cancels exactly, and 400 such nulls are called at the test's level."""
    rows = [[0, 1, 3, 2], [1, 2, 0, 3], [2, 3, 1, 0]]
    rng = np.random.default_rng(1)
    y, pos = _four_arm_null(rng, 3, (0.10, 0, 0, 0), rows)
    y = y * 1e-4 + np.log1p(-np.asarray((0.10, 0, 0, 0)))[pos]  # almost no noise: the drift alone
    (e,), note = block_effects(y, LAYOUT, pos)
    assert note.startswith("rounds, arms and positions") and e.dof == 3 and abs(e.ratio - 1) < 1e-3
    assert block_effects(y, LAYOUT)[0][0].ratio > 1.015  # the drift read as a gain of the candidate
    calls = 0
    for _ in range(400):
        y, pos = _four_arm_null(rng, 3, (0.10, 0, 0, 0), rows)
        calls += block_effects(y, LAYOUT, pos)[0][0].verdict != "inconclusive"
    assert calls / 400 <= 0.08


def test_an_order_that_cannot_separate_places_from_arms_drops_the_place_term():
    same = np.tile(np.arange(4), (3, 1))  # every round the same order
    (e,), note = block_effects(np.random.default_rng(0).normal(0, 0.05, (3, 4)), LAYOUT, same)
    assert "does not separate" in note and e.dof == 6


def test_an_order_that_does_not_run_every_arm_once_is_refused():
    with pytest.raises(SceneEplbError, match="every arm once"):
        block_effects(np.zeros((3, 4)), LAYOUT, [[0, 0, 1, 2]] * 3)


def test_a_contrast_whose_weights_do_not_sum_to_zero_is_refused():
    with pytest.raises(SceneEplbError, match="summing to 0"):
        block_effects(np.zeros((3, 4)), [(1.0, 0, 0, 0)])
