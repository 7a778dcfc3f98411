"""One scene: the stages in order for one set of weights, and the robust choice over the passes.

``fit_weights(weights [L, E], options) -> (Fitted, score [L])``: replicas, placement, refinement or
the static table, never worse than the linear layout per layer; ``fit_map(train [T, L, E], options)``:
on the totals, or with ``robust`` on mean + kappa x std per layer, keeping each layer's best per-pass
score (``pick_per_layer``).
"""

from __future__ import annotations

import functools

import numpy as np

from ..layouts.layout import Geometry, linear_map, replica_counts, same_rank_duplicates
from ..layouts.score import ideal_score, per_pass_score, rank_score, static_score, static_slot_loads
from .options import ROBUST_KAPPAS, FitOptions, Fitted
from .placement import place
from .refinement import refine
from .replicas import allocate_replicas
from .static_table import even_sources, fit_static_table, table_sources


def fit_weights(weights: np.ndarray, options: FitOptions) -> tuple[Fitted, np.ndarray]:
    """Fit one map to total weights [L, E] (all-zero layers get uniform weights); returns it with
    its per-layer score under the options' dispatch."""
    g = options.geometry
    weights = np.where(weights.sum(axis=1, keepdims=True) > 0, weights, 1.0).astype(np.float64)
    replicas = allocate_replicas(weights, g.num_redundant, g.ep_size)
    p2l = place(
        replicas, weights, g, spread_nodes=options.dispatch == "static", groups=options.expert_groups, hedge=options.group_hedge
    )
    if options.dispatch == "static" and g.num_redundant:  # refined with the loads its own table gives
        fitted = fit_static_table(p2l, weights, options)
        score = static_score(fitted.map, weights, g, fitted.static_sources)
    else:  # (without redundant slots every rank serves every expert's one replica: static is the even split)
        p2l, _ = refine(p2l, np.take_along_axis(weights / replicas, p2l, axis=1), g, options.max_rounds, options.tolerance)
        sources = even_sources(p2l, g) if options.dispatch == "static" else None
        fitted, score = Fitted(p2l, sources), ideal_score(p2l, weights, g)
    return _no_worse_than_linear(fitted, score, weights, options)


def _no_worse_than_linear(
    fitted: Fitted, score: np.ndarray, weights: np.ndarray, options: FitOptions
) -> tuple[Fitted, np.ndarray]:
    """Keep the engines' default (linear) layout in any layer where it scores better than the fit
    (whose per-layer ``score`` is given), e.g. tiny geometries where replicating a cold expert
    beats replicating a hot one; the linear layout must be valid."""
    g = options.geometry
    p2l = fitted.map
    linear = linear_map(g, len(p2l))
    if same_rank_duplicates(linear, g):
        return fitted, score
    slot_loads = weights @ _linear_slot_shares(g, options.dispatch)
    theirs = rank_score(slot_loads.reshape(len(p2l), g.ep_size, -1).sum(axis=2))
    use = theirs < score - 1e-12
    if not use.any():
        return fitted, score
    sources = None if fitted.static_sources is None else np.where(use[:, None], table_sources(linear, g), fitted.static_sources)
    return Fitted(np.where(use[:, None], linear, p2l), sources), np.where(use, theirs, score)


@functools.lru_cache(maxsize=16)
def _linear_slot_shares(g: Geometry, dispatch: str) -> np.ndarray:
    """Share of each expert's load that each slot of the linear layout takes: float [E, P]. The
    linear layout is the same in every layer, so its dispatch table is computed once."""
    E = g.num_experts
    linear = linear_map(g, E)
    if dispatch == "static":
        return static_slot_loads(linear, np.eye(E), g)
    return np.eye(E)[:, linear[0]] / replica_counts(linear[:1], E)[0][linear[0]]


def fit_map(train: np.ndarray, options: FitOptions) -> Fitted:
    """Fit a map [L, P] (and static table) to train counts [T, L, E]; robust mode picks, per layer,
    the risk weight (mean + kappa * std over passes) whose map has the lowest expected per-pass
    peak on train."""
    train = np.asarray(train, dtype=np.float64)
    total = train.sum(axis=0)
    if not options.robust or train.shape[0] < 2:
        return fit_weights(total, options)[0]
    T = train.shape[0]
    std = train.std(axis=0) * T
    best, best_score = None, None
    for kappa in ROBUST_KAPPAS:
        fitted, _ = fit_weights(total + kappa * std, options)
        s = per_pass_score(fitted.map, train, options.geometry)
        best, best_score = (fitted, s) if best is None or best_score is None else pick_per_layer(best, best_score, fitted, s)
    assert best is not None  # ROBUST_KAPPAS is not empty
    return best


def pick_per_layer(a: Fitted, a_score: np.ndarray, b: Fitted, b_score: np.ndarray) -> tuple[Fitted, np.ndarray]:
    """Per layer, the fit with the lower score (``a`` on ties)."""
    better = b_score < a_score - 1e-12
    sources = (
        None
        if a.static_sources is None or b.static_sources is None
        else np.where(better[:, None], b.static_sources, a.static_sources)
    )
    return Fitted(np.where(better[:, None], b.map, a.map), sources), np.where(better, b_score, a_score)
