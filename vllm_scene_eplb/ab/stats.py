"""The one statistics of an A/B over rounds: within-round log ratios, a Student t interval over
rounds, and a verdict. Pure (numpy and the standard library); the factorial A/B and the throughput
check of ``verify.sh`` both use it (``block_effects``).

A round runs every arm once (each its own server start, in an order that varies between rounds and
is recorded), so each round gives one log ratio per contrast, and a machine's slow drift or a bad
hour falls on both sides of it alike. Rounds are independent; with multiplicative run-to-run noise
the logs are close to normal, and the block model's t interval is exact at any number of rounds
under normality (``block_effects`` says how a drift between the places in a round is taken out).
Why t and not an exact sign-flip permutation test over rounds: the
sign-flip test has only 2^n equally likely outcomes, so its smallest two-sided p is 2 / 2^n (0.25 at
3 rounds, 0.0625 at 5): below 6 rounds it can never reach 5%, and the rounds a hardware A/B
affords are 3 to 5. The t quantile is computed here (no scipy): the regularised incomplete beta by
its continued fraction, inverted by bisection (``t_quantile``, checked against tables in the tests).

Fewer than ``MIN_ROUNDS`` rounds give the ratio (and its interval where the model leaves a residual
degree of freedom) but no positive/negative verdict: at 2 rounds a single odd round decides it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import SceneEplbError

LEVEL = 0.95
MIN_ROUNDS = 3
POSITIVE, NEGATIVE, INCONCLUSIVE = "positive", "negative", "inconclusive"
_EPS = 1e-15


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta (modified Lentz), converging for x < (a+1)/(a+b+2)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < _EPS:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta I_x(a, b), for a, b > 0 and x in [0, 1]."""
    if not (a > 0 and b > 0 and 0.0 <= x <= 1.0):
        raise ValueError(f"betainc needs a, b > 0 and x in [0, 1], got {a}, {b}, {x}")
    if x in (0.0, 1.0):
        return x
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on ``t_cdf``)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"a quantile needs p in (0, 1), got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class Effect:
    """One contrast over rounds: ``ratio`` = exp(its estimate on the log scale), its ``ci`` (None where
    the rounds leave no residual degree of freedom), ``verdict`` (positive / negative / inconclusive,
    read in the metric's better direction), the ``rounds`` it rests on, the residual degrees of
    freedom ``dof`` and ``note`` (why there is no verdict, if there is none)."""

    ratio: float
    ci: tuple[float, float] | None
    verdict: str
    rounds: int
    dof: int
    note: str = ""

    def to_dict(self) -> dict:
        return {
            "ratio": self.ratio,
            "ci": list(self.ci) if self.ci else None,
            "verdict": self.verdict,
            "rounds": self.rounds,
            "dof": self.dof,
            "note": self.note,
        }


def check_positive(values, what: str) -> np.ndarray:
    """``values`` as float64, refused in one line unless every one is a finite number above 0 (a log
    ratio of a run that served nothing, or of a missing metric, is no evidence)."""
    arr = np.asarray(values, dtype=np.float64)
    bad = ~(np.isfinite(arr) & (arr > 0))
    if bad.any():
        raise SceneEplbError(f"{what}: {arr[bad][0]!r} is not a positive finite number (a run that served nothing?)")
    return arr


def _design(rounds: int, arms: int, positions: np.ndarray | None) -> np.ndarray:
    """The block model's design matrix, one row per run (round-major): a level per round, an effect
    per arm but the last, and with ``positions`` an effect per position in the round but the last."""
    eye_r, eye_a = np.eye(rounds), np.eye(arms)
    cols = [np.repeat(eye_r, arms, axis=0), np.tile(eye_a[:, :-1], (rounds, 1))]
    if positions is not None:
        cols.append(eye_a[positions.reshape(-1)][:, :-1])
    return np.hstack(cols)


def block_effects(
    log_y, contrasts, positions=None, higher_is_better: bool = True, level: float = LEVEL
) -> tuple[list[Effect], str]:
    """Contrasts between arms run in rounds, with a t interval over rounds and a verdict.

    ``log_y`` [rounds, arms]: the log of each arm's value in each round (every arm once a round);
    ``contrasts`` [C, arms]: weights over the arms summing to 0 per contrast; ``positions``
    [rounds, arms] (optional): where in its round each run ran (0 = first). The model is
    ``log y = round + arm (+ position) + noise``, fitted by least squares: each contrast's estimate is
    then the mean of its within-round log ratios (exactly, without ``positions``), a level shift of a
    whole round cancels, and with ``positions`` so does a drift between the places in a round (the
    first run after a start always slow, say) that a random order would only cancel on average (and
    at 3 rounds, not at its stated level). The interval is ``estimate +- t(dof) x its standard
    error`` from the pooled residual; a position term the order cannot separate from the arms (or
    that leaves no residual degree of freedom, as at 2 rounds) is dropped, said in the returned note. From ``MIN_ROUNDS`` rounds on, an interval clear of 1 is a
    verdict. Returns the effects in ``contrasts``' order and a note on the model used."""
    y = np.asarray(log_y, dtype=np.float64)
    c = np.asarray(contrasts, dtype=np.float64)
    if y.ndim != 2 or y.shape[0] < 1 or y.shape[1] < 2 or not np.isfinite(y).all():
        raise SceneEplbError(f"block effects need one finite log value per round and arm, got shape {list(y.shape)}")
    if c.ndim != 2 or c.shape[1] != y.shape[1] or np.abs(c.sum(axis=1)).max() > 1e-9:
        raise SceneEplbError("each contrast needs one weight per arm, summing to 0")
    rounds, arms = y.shape
    note = "rounds and arms"
    x = _design(rounds, arms, None)
    if positions is not None:
        pos = np.asarray(positions)
        if pos.shape != y.shape or any(sorted(row) != list(range(arms)) for row in pos.tolist()):
            raise SceneEplbError("positions must place every arm once in each round")
        with_pos = _design(rounds, arms, pos)
        if np.linalg.matrix_rank(with_pos) == with_pos.shape[1] < with_pos.shape[0]:
            x, note = with_pos, "rounds, arms and positions in the round"
        else:
            note = "rounds and arms (the order does not separate the positions from the arms with a degree of freedom left)"
    beta, *_ = np.linalg.lstsq(x, y.reshape(-1), rcond=None)
    dof = x.shape[0] - x.shape[1]
    arm_cols = slice(rounds, rounds + arms - 1)
    estimates = c[:, :-1] @ beta[arm_cols]  # the last arm is the reference (its effect 0)
    if dof > 0:
        resid = y.reshape(-1) - x @ beta
        cov = np.linalg.inv(x.T @ x)[arm_cols, arm_cols] * float(resid @ resid) / dof
        se = np.sqrt(np.maximum(np.einsum("ci,ij,cj->c", c[:, :-1], cov, c[:, :-1]), 0.0))
        half = t_quantile(0.5 + level / 2.0, dof) * se
    out = []
    for k, est in enumerate(estimates):
        ratio = float(np.exp(est))
        if dof <= 0:
            out.append(Effect(ratio, None, INCONCLUSIVE, rounds, 0, f"{rounds} round(s): no interval and no verdict"))
            continue
        lo, hi = float(np.exp(est - half[k])), float(np.exp(est + half[k]))
        if rounds < MIN_ROUNDS:
            verdict, why = INCONCLUSIVE, f"{rounds} rounds: no verdict below {MIN_ROUNDS} rounds"
        elif lo > 1.0 or hi < 1.0:
            verdict, why = (POSITIVE if (lo > 1.0) == higher_is_better else NEGATIVE), ""
        else:
            verdict, why = INCONCLUSIVE, "the interval spans 1"
        out.append(Effect(ratio, (lo, hi), verdict, rounds, dof, why))
    return out, note
