"""The one statistics of an A/B over rounds: within-round log ratios, a Student t interval over
rounds, and a verdict. Pure (numpy and the standard library); the factorial A/B and the throughput
check of ``verify.sh`` both use it.

A round runs every arm once (each its own server start, in an order random per round), so each
round gives one log ratio per contrast, and a machine's slow drift or a bad hour falls on both sides
of it alike. Rounds are independent, so the contrasts are independent draws; with multiplicative
run-to-run noise their logs are close to normal, and ``mean +- t(0.975, n-1) x sd / sqrt(n)`` is
exact at any n under normality. Why t and not an exact sign-flip permutation test over rounds: the
sign-flip test has only 2^n equally likely outcomes, so its smallest two-sided p is 2 / 2^n (0.25 at
3 rounds, 0.0625 at 5): below 6 rounds it can never reach 5%, and the rounds a hardware A/B
affords are 3 to 5. The t quantile is computed here (no scipy): the regularised incomplete beta by
its continued fraction, inverted by bisection (``t_quantile``, checked against tables in the tests).

Fewer than ``MIN_ROUNDS`` rounds give the ratio (and, at 2, its interval) but no positive/negative
verdict: at 2 rounds the interval rests on one degree of freedom, and a single odd round decides it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .errors import SceneEplbError

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
    """One contrast over rounds: ``ratio`` = exp(mean log ratio), its ``ci`` (None under 2 rounds),
    ``verdict`` (positive / negative / inconclusive, read in the metric's better direction), the
    ``rounds`` it rests on and ``note`` (why there is no verdict, if there is none)."""

    ratio: float
    ci: tuple[float, float] | None
    verdict: str
    rounds: int
    note: str = ""

    def to_dict(self) -> dict:
        return {
            "ratio": self.ratio,
            "ci": list(self.ci) if self.ci else None,
            "verdict": self.verdict,
            "rounds": self.rounds,
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


def effect(log_ratios, higher_is_better: bool = True, level: float = LEVEL) -> Effect:
    """The effect of one contrast from its within-round log ratios (shape [rounds]): the t interval
    over rounds and, from ``MIN_ROUNDS`` rounds on, whether it lies on the better or worse side of 1."""
    x = np.asarray(log_ratios, dtype=np.float64)
    if x.ndim != 1 or x.size < 1 or not np.isfinite(x).all():
        raise SceneEplbError(f"an effect needs one finite log ratio per round, got {x.tolist()!r}")
    n = x.size
    ratio = float(np.exp(x.mean()))
    if n < 2:
        return Effect(ratio, None, INCONCLUSIVE, n, "1 round: no interval and no verdict (3 rounds or more give one)")
    half = t_quantile(0.5 + level / 2.0, n - 1) * float(x.std(ddof=1)) / math.sqrt(n)
    lo, hi = float(np.exp(x.mean() - half)), float(np.exp(x.mean() + half))
    if n < MIN_ROUNDS:
        return Effect(ratio, (lo, hi), INCONCLUSIVE, n, f"{n} rounds: no verdict below {MIN_ROUNDS} rounds")
    if lo > 1.0 or hi < 1.0:
        return Effect(ratio, (lo, hi), POSITIVE if (lo > 1.0) == higher_is_better else NEGATIVE, n)
    return Effect(ratio, (lo, hi), INCONCLUSIVE, n, "the interval spans 1")
