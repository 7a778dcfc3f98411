"""Scores of a layout on counts: per-rank loads and the max/mean balance ratio per layer.

- ideal: each replica takes an even share w_e / c_e (also what ``dynamic`` dispatch predicts);
- static: each source rank sends w_e / ep_size to the replica its static table names;
- per-pass: the ideal score of every recorded pass (ring entry), averaged with the passes' token
  weights (the expected per-pass peak, which a sum over passes hides).
A score of 1.0 is perfect balance. It screens layouts; it is not a device speedup.
"""

from __future__ import annotations

import numpy as np

from .dispatch import replicated_static_choices
from .layout import Geometry, replica_counts


def ideal_rank_loads(p2l: np.ndarray, weights: np.ndarray, geometry: Geometry) -> np.ndarray:
    """Per-rank load with an even split over replicas: float [..., L, ep] for weights [..., L, E]."""
    c = replica_counts(p2l, geometry.num_experts)
    share = np.asarray(weights, dtype=np.float64) / np.maximum(c, 1)
    slot_load = np.take_along_axis(share, np.broadcast_to(p2l, share.shape[:-1] + p2l.shape[-1:]), axis=-1)
    return slot_load.reshape(slot_load.shape[:-1] + (geometry.ep_size, geometry.slots_per_rank)).sum(axis=-1)


def static_slot_loads(p2l: np.ndarray, weights: np.ndarray, geometry: Geometry, sources: np.ndarray | None = None) -> np.ndarray:
    """Load of every slot under the static table, each source rank holding 1/ep of every expert's
    tokens: float [L, P]. With fitted ``sources`` [L, P] (source ranks per slot) that is the
    expert's load times sources / ep; else a single replica takes its expert's whole load and
    replicated experts follow the even-split table."""
    L, P, ep = p2l.shape[0], geometry.num_physical, geometry.ep_size
    weights = np.asarray(weights, dtype=np.float64)
    if sources is not None:
        return np.take_along_axis(weights, p2l, axis=1) * (sources / ep)
    _, replicas, li, ei, chosen = replicated_static_choices(p2l, geometry)
    single = np.take_along_axis(replicas, p2l, axis=1) == 1
    loads = np.where(single, np.take_along_axis(weights, p2l, axis=1), 0.0)
    shared = np.bincount((li[:, None] * P + chosen).ravel(), weights=np.repeat(weights[li, ei] / ep, ep), minlength=L * P)
    return loads + shared.reshape(L, P)


def static_rank_loads(p2l: np.ndarray, weights: np.ndarray, geometry: Geometry, sources: np.ndarray | None = None) -> np.ndarray:
    """Per-rank load under the static table: float [L, ep]."""
    return static_slot_loads(p2l, weights, geometry, sources).reshape(len(p2l), geometry.ep_size, -1).sum(axis=2)


def rank_score(loads: np.ndarray) -> np.ndarray:
    """The score of rank loads: max/mean over the last (rank) axis; 1.0 where a layer carries no load."""
    mean = loads.mean(axis=-1)
    peak = loads.max(axis=-1)
    return np.where(mean > 0, peak / np.where(mean > 0, mean, 1.0), 1.0)


def ideal_score(p2l: np.ndarray, weights: np.ndarray, geometry: Geometry) -> np.ndarray:
    """Ideal (even-split) score per layer: float [L]."""
    return rank_score(ideal_rank_loads(p2l, weights, geometry))


def static_score(p2l: np.ndarray, weights: np.ndarray, geometry: Geometry, sources: np.ndarray | None = None) -> np.ndarray:
    """Static-dispatch score per layer: float [L]."""
    return rank_score(static_rank_loads(p2l, weights, geometry, sources))


def dispatch_score(
    p2l: np.ndarray, weights: np.ndarray, geometry: Geometry, dispatch: str, sources: np.ndarray | None = None
) -> np.ndarray:
    """Predicted score under a dispatch algorithm (``dynamic`` splits evenly, so it equals ideal;
    ``static`` follows the fitted ``sources`` when given)."""
    return static_score(p2l, weights, geometry, sources) if dispatch == "static" else ideal_score(p2l, weights, geometry)


def per_pass_score(p2l: np.ndarray, passes: np.ndarray, geometry: Geometry) -> np.ndarray:
    """Expected per-pass peak: ideal score of each pass [T, L, E], weighted by its load, per layer [L]."""
    loads = ideal_rank_loads(p2l, passes, geometry)  # [T, L, ep]
    per_pass = rank_score(loads)  # [T, L]
    w = loads.sum(axis=-1)
    total = w.sum(axis=0)
    return np.where(total > 0, (per_pass * w).sum(axis=0) / np.where(total > 0, total, 1.0), 1.0)
