"""The count -> time model: per MoE layer, a rank's MoE ms per pass against the assignments it computed.

From the running server's timing window (``protocol.TimingWindow``: every rank's local expert ms
per pass and the assignments it computed per pass, per MoE layer; best the record's own window,
``live.record_time``, which times exactly the dump's passes) the model fits, per layer, t = a + b * n
(least squares over the ranks; a layer whose fit has no positive slope takes the fit pooled over all
layers, since a model's MoE layers share their shapes). A window that does not pin the pooled slope
down (not positive, or its relative standard error above ``MAX_SLOPE_ERROR``: the ranks computed too
similar loads, as under a balanced layout) gives no ratio, only the bound of the steepest slope its
mean points allow (no fixed cost).

**A cost per active slot.** A rank reads the weights of every slot that computes at least one
assignment in a pass, once, whatever their number: t = a_layer + b * n + c * k, k the rank's active
slots (b and c pooled over layers, fitted within layers, so the layers' fixed costs stay theirs).
Where the window carries its ranks' active slots (``TimingWindow.rank_active_slots``) and they move
apart from the assignments, c is fitted (``fit_slot_model``); where they move together (collinear:
a layer's ranks all read all their slots, or their slots follow their loads) the window cannot tell
c * k from the fixed cost or from b * n, and the model says so: c lies between 0 and the largest c
that leaves every layer a non-negative fixed cost and slope (``SlotCost``). Without them c is
unpriced (0). Across the ranks of one window the active slots mostly follow the assignments; across
the window's pass-size groups (``TimingWindow.pass_groups``: small passes about one assignment per
active slot, large ones every slot active with many) they move apart, so where the window has two or
more groups b and c are fitted across them first. Pure numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from ..protocol import PassGroup

MAX_SLOPE_ERROR = 0.25  # a pooled slope less certain than this is not identified by the window
# Active slots whose within-layer spread follows the assignments' this closely (|correlation|) do not
# separate c from b, and active slots that hardly spread (relative to their mean) do not separate c from a.
MAX_SLOT_CORRELATION = 0.98
MIN_SLOT_SPREAD = 0.02
# How the model priced the cost per active slot (``TimeModel.slots``).
SLOTS_PRICED, SLOTS_UNIDENTIFIED, SLOTS_UNPRICED = "priced", "unidentified", "unpriced"


@dataclass(frozen=True)
class TimeModel:
    """Per MoE layer t = a + b * n (ms per pass for n assignments on a rank), the relative RMS
    residual of the fit on the points it came from, the slope pooled over all layers with its
    relative standard error, ``b_max`` [L]: the steepest slope a layer's mean point allows
    with a non-negative fixed cost (all of its time proportional to assignments), and ``c`` the ms
    per active slot on a rank (0 unless ``slots`` is ``SLOTS_PRICED`` or the model is a bound)."""

    a: np.ndarray
    b: np.ndarray
    residual: float
    pooled_b: float
    slope_error: float
    b_max: np.ndarray
    c: float = 0.0
    slots: str = SLOTS_UNPRICED

    def rank_ms(self, loads: np.ndarray, active: np.ndarray | None = None) -> np.ndarray:
        """Every rank's predicted ms for per-rank loads and active slots [..., L, ranks]: [..., L, ranks]."""
        ms = self.a[:, None] + self.b[:, None] * loads
        return ms if active is None or self.c == 0 else ms + self.c * active

    def critical(self, loads: np.ndarray, active: np.ndarray | None = None) -> np.ndarray:
        """The MoE critical path (sum over layers of the slowest rank) for loads and active slots [..., L, ranks]: [...]."""
        return self.rank_ms(loads, active).max(axis=-1).sum(axis=-1)

    @property
    def identified(self) -> bool:
        """Whether the window pins the slope down: positive, with a relative standard error of at most ``MAX_SLOPE_ERROR``."""
        return self.pooled_b > 0 and self.slope_error <= MAX_SLOPE_ERROR

    def steepest(self) -> TimeModel:
        """The bound: no fixed cost, every layer at its ``b_max`` (the largest gain the window allows)."""
        return TimeModel(np.zeros_like(self.a), self.b_max, self.residual, self.pooled_b, self.slope_error, self.b_max)

    def with_slot_cost(self, c: float, alpha: np.ndarray, beta: float) -> TimeModel:
        """This model with ``c`` ms per active slot where a window's active slots follow k = alpha + beta * n
        (``alpha`` [L]): taken out of each layer's fixed cost and slope, so the window's points keep their time."""
        return replace(self, a=self.a - c * alpha, b=self.b - c * beta, c=float(c), slots=SLOTS_UNIDENTIFIED)


@dataclass(frozen=True)
class SlotCost:
    """What the window says about the cost per active slot: ``model`` (c fitted where ``slots`` is
    ``SLOTS_PRICED``, else 0), and where c is not identified the other end of what the window allows,
    ``bound`` (the largest c that leaves every layer a non-negative fixed cost and slope); ``why`` in words."""

    model: TimeModel
    bound: TimeModel | None
    why: str


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


def _pooled(base: TimeModel, ms: np.ndarray, n: np.ndarray, k: np.ndarray, b: float, c: float, slots: str) -> TimeModel:
    """``base`` with ``b`` and ``c`` pooled over layers and each layer's fixed cost through its mean point; [ranks, L] each."""
    a = ms.mean(axis=0) - b * n.mean(axis=0) - c * k.mean(axis=0)
    fitted = a[None, :] + b * n + c * k
    residual = float(np.sqrt(np.mean((fitted - ms) ** 2)) / max(float(ms.mean()), 1e-12))
    return replace(base, a=a, b=np.full_like(base.b, b), residual=residual, c=float(c), slots=slots)


def _slope(x: np.ndarray, y: np.ndarray) -> float:
    """The least-squares slope through the origin of y on x (differences from their layer's mean), at least 0."""
    return max(float((x * y).sum() / max(float((x**2).sum()), 1e-300)), 0.0)


def _collinear(dn: np.ndarray, dk: np.ndarray, k_mean: float, w: np.ndarray | float = 1.0) -> tuple[float, float]:
    """(spread, |correlation|) of the active slots' differences ``dk`` against the assignments' ``dn``
    (from their layer's mean, weighted by ``w``): what tells c apart from the fixed cost and from b."""
    spread = float(np.sqrt((w * dk**2).sum() / max(float(np.broadcast_to(w, dk.shape).sum()), 1e-300)) / max(k_mean, 1e-12))
    sn, sk = float((w * dn**2).sum()), float((w * dk**2).sum())
    corr = abs(float((w * dn * dk).sum()) / np.sqrt(sn * sk)) if spread > 0 and sn > 0 and sk > 0 else 1.0
    return spread, corr


def _fit_bc(dm: np.ndarray, dn: np.ndarray, dk: np.ndarray, w: np.ndarray | float = 1.0) -> tuple[float, float]:
    """b and c of dm = b dn + c dk (weighted least squares, weights ``w``), a negative one dropped and the other refitted."""
    root = np.sqrt(np.broadcast_to(w, dm.shape))
    (b, c), *_ = np.linalg.lstsq(np.stack([(root * dn).ravel(), (root * dk).ravel()], axis=1), (root * dm).ravel(), rcond=None)
    if c < 0 or b < 0:
        b, c = (0.0, _slope(root * dk, root * dm)) if c >= 0 else (_slope(root * dn, root * dm), 0.0)
    return float(b), float(c)


def _across_passes(groups: Sequence[PassGroup]) -> tuple[float, float, str] | str:
    """b, c and the fit in words from a window's pass-size groups (``protocol.PassGroup``: per pass
    each rank's ms, assignments and active slots): every (group, rank) point of a layer against the
    layer's passes-weighted mean, each weighted by its group's passes; or why they do not identify c."""
    ms, n, k = (np.stack([np.asarray(getattr(g, key), dtype=np.float64) for g in groups]) for key in _GROUP_KEYS)
    w = np.asarray([g.passes for g in groups], dtype=np.float64)[:, None, None] * np.ones_like(ms)  # [G, ranks, L]
    centred = [x - (w * x).sum(axis=(0, 1), keepdims=True) / w.sum(axis=(0, 1), keepdims=True) for x in (ms, n, k)]
    dm, dn, dk = centred
    spread, corr = _collinear(dn, dk, float((w * k).sum() / w.sum()), w)
    sizes = ", ".join(f"{g.tokens[0]}-{'' if g.tokens[1] is None else g.tokens[1] - 1} ({g.passes})" for g in groups)
    if spread < MIN_SLOT_SPREAD or corr > MAX_SLOT_CORRELATION:
        return (
            f"the window's {len(groups)} pass-size groups (tokens per pass, passes: {sizes}) do not tell c apart either "
            f"(spread {spread:.1%}, correlation {corr:.3f})"
        )
    b, c = _fit_bc(dm, dn, dk, w)
    return (
        b,
        c,
        f"{c:.4g} ms per active slot and {b:.4g} ms per assignment, pooled over layers, fitted across the window's "
        f"{len(groups)} pass-size groups x {ms.shape[1]} ranks (tokens per pass, passes: {sizes}; correlation {corr:.3f})",
    )


_GROUP_KEYS = ("rank_ms", "rank_assignments", "rank_active_slots")


def fit_slot_model(
    base: TimeModel,
    rank_ms: np.ndarray,
    rank_assignments: np.ndarray,
    rank_active: np.ndarray | None,
    groups: Sequence[PassGroup] = (),
) -> SlotCost:
    """The cost per active slot beside ``base`` (``fit_time_model`` of the same window): ms,
    assignments and active slots per pass, all [ranks, L]. With active slots, b and c are pooled
    over layers and fitted on the points' differences from their layer's mean (a negative one
    dropped and the other refitted): across the window's pass-size ``groups`` where it has two or more
    and they tell c apart (``_across_passes``), else across its ranks; where c is not identified, b
    alone so, and the bound beside it."""
    if rank_active is None:
        return SlotCost(base, None, "no cost per active slot priced: the timing window carries no active slots per rank")
    ms, n, k = (np.asarray(x, dtype=np.float64) for x in (rank_ms, rank_assignments, rank_active))
    across = _across_passes(groups) if len(groups) >= 2 else "the window has no pass-size groups to fit across"
    if not isinstance(across, str):
        b, c, why = across
        return SlotCost(_pooled(base, ms, n, k, b, c, SLOTS_PRICED), None, why)
    dm, dn, dk = (x - x.mean(axis=0, keepdims=True) for x in (ms, n, k))
    spread, corr = _collinear(dn, dk, float(k.mean()))
    if spread < MIN_SLOT_SPREAD or corr > MAX_SLOT_CORRELATION:
        model = _pooled(base, ms, n, k, _slope(dn, dm), 0.0, SLOTS_UNIDENTIFIED)
        # the window's active slots as k = alpha + beta * n within layers: any c up to c_max explains it
        beta = _slope(dn, dk)
        alpha = k.mean(axis=0) - beta * n.mean(axis=0)
        limits = [*(model.b / beta if beta > 0 else []), *(model.a[alpha > 0] / alpha[alpha > 0])]
        c_max = max(0.0, float(min(limits))) if limits else 0.0
        why = (
            f"the cost per active slot is not identified: the ranks' active slots {'hardly differ' if spread < MIN_SLOT_SPREAD else 'follow their assignments'} "
            f"in this window (spread {spread:.1%}, correlation {corr:.3f}) and {across}; it lies between 0 and {c_max:.4g} ms per slot"
        )
        return SlotCost(model, model.with_slot_cost(c_max, alpha, beta), why)
    b, c = _fit_bc(dm, dn, dk)
    model = _pooled(base, ms, n, k, b, c, SLOTS_PRICED)
    return SlotCost(
        model, None, f"{c:.4g} ms per active slot and {b:.4g} ms per assignment, pooled over layers, fitted across ranks"
    )
