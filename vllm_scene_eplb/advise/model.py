"""The count -> time model: per MoE layer, a rank's MoE ms per pass against the assignments it computed.

From the running server's timing window (``protocol.TimingWindow``: every rank's local expert ms
per pass and the assignments it computed per pass, per MoE layer; best the record's own window,
``live.record_time``, which times exactly the dump's passes) the model fits, per layer, t = a + b * n
(least squares over the ranks; a layer whose fit has no positive slope takes the fit pooled over all
layers, since a model's MoE layers share their shapes). A window that does not pin the pooled slope
down (not positive, or its relative standard error above ``MAX_SLOPE_ERROR``: the ranks computed too
similar loads, as under a balanced layout) gives no ratio, only the bound of the steepest slope its
mean points allow (no fixed cost). Pure numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_SLOPE_ERROR = 0.25  # a pooled slope less certain than this is not identified by the window


@dataclass(frozen=True)
class TimeModel:
    """Per MoE layer t = a + b * n (ms per pass for n assignments on a rank), the relative RMS
    residual of the fit on the points it came from, the slope pooled over all layers with its
    relative standard error, and ``b_max`` [L]: the steepest slope a layer's mean point allows
    with a non-negative fixed cost (all of its time proportional to assignments)."""

    a: np.ndarray
    b: np.ndarray
    residual: float
    pooled_b: float
    slope_error: float
    b_max: np.ndarray

    def rank_ms(self, loads: np.ndarray) -> np.ndarray:
        """Every rank's predicted ms for per-rank loads [..., L, ranks]: [..., L, ranks]."""
        return self.a[:, None] + self.b[:, None] * loads

    def critical(self, loads: np.ndarray) -> np.ndarray:
        """The MoE critical path (sum over layers of the slowest rank) for loads [..., L, ranks]: [...]."""
        return self.rank_ms(loads).max(axis=-1).sum(axis=-1)

    @property
    def identified(self) -> bool:
        """Whether the window pins the slope down: positive, with a relative standard error of at most ``MAX_SLOPE_ERROR``."""
        return self.pooled_b > 0 and self.slope_error <= MAX_SLOPE_ERROR

    def steepest(self) -> TimeModel:
        """The bound: no fixed cost, every layer at its ``b_max`` (the largest gain the window allows)."""
        return TimeModel(np.zeros_like(self.a), self.b_max, self.residual, self.pooled_b, self.slope_error, self.b_max)


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares a, b of y = a + b x (b = 0 when x does not vary)."""
    if np.ptp(x) <= 0:
        return float(y.mean()), 0.0
    b, a = np.polyfit(x, y, 1)
    return float(a), float(b)


def _slope_error(x: np.ndarray, y: np.ndarray, a: float, b: float) -> float:
    """The least-squares slope's standard error over |b|: inf without spread in x or with b = 0;
    with two points, 0 (a line through both) or inf."""
    spread = float(((x - x.mean()) ** 2).sum())
    if spread <= 0 or b == 0:
        return float("inf")
    residual = float(((a + b * x - y) ** 2).sum())
    if x.size < 3:
        return 0.0 if residual <= 1e-18 else float("inf")
    return float(np.sqrt(residual / (x.size - 2) / spread) / abs(b))


def fit_time_model(rank_ms: np.ndarray, rank_assignments: np.ndarray) -> TimeModel:
    """The model from a timing window: ms and assignments per pass, both [ranks, L]."""
    ms, n = np.asarray(rank_ms, dtype=np.float64), np.asarray(rank_assignments, dtype=np.float64)
    pooled = _line(n.ravel(), ms.ravel())
    a, b = np.empty(ms.shape[1]), np.empty(ms.shape[1])
    for layer in range(ms.shape[1]):
        a[layer], b[layer] = _line(n[:, layer], ms[:, layer])
        if b[layer] <= 0:
            a[layer], b[layer] = pooled
    fitted = a[None, :] + b[None, :] * n
    residual = float(np.sqrt(np.mean((fitted - ms) ** 2)) / max(float(ms.mean()), 1e-12))
    b_max = ms.mean(axis=0) / np.maximum(n.mean(axis=0), 1e-12)
    return TimeModel(a, b, residual, pooled[1], _slope_error(n.ravel(), ms.ravel(), *pooled), b_max)
