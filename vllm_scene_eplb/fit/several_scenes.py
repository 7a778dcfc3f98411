"""Stage 5, several scenes: one layout for a weighted mix of recorded scenes.

``fit_scenes(trains [K x [T_s, L, E]], weights [K], options) -> Fitted``: each scene normalised per
layer and mixed by weight (``mean``); with the ``worst`` objective, the layers whose worst scene
scores highest (``WORST_REFIT_SHARE`` of them) are refitted to a mix weighted by how far each scene
is from balance, keeping per layer the fit with the better worst scene.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..layouts.layout import replica_counts
from ..layouts.scenes import mix_passes, normalised_totals
from ..layouts.score import dispatch_score
from .one_scene import fit_map, pick_per_layer
from .options import WORST_REFIT_SHARE, FitOptions, Fitted
from .refinement import refine
from .static_table import fit_static_table


def fit_scenes(trains: Sequence[np.ndarray], weights: np.ndarray, options: FitOptions) -> Fitted:
    """Fit one map to several scenes' train passes (each [T_s, L, E]) with scene ``weights`` [K]
    summing to 1. Each scene is normalised per layer first, so a long recording does not drown a
    short one; ``options.objective`` says what is balanced (``OBJECTIVES``)."""
    fitted = fit_map(mix_passes(trains, weights), options)
    if options.objective == "mean" or len(trains) < 2:
        return fitted
    return _refit_worst_scenes(fitted, normalised_totals(trains), weights, options)


def _refit_worst_scenes(fitted: Fitted, scenes: np.ndarray, weights: np.ndarray, options: FitOptions) -> Fitted:
    """The ``worst`` objective: in the layers whose worst scene scores highest (``WORST_REFIT_SHARE``
    of them), refit to a mix that weighs each scene by how far it is from balance, and keep per
    layer whichever fit has the better worst scene. ``scenes`` [K, L, E] are normalised totals.
    Why only those layers: they hold the worst-scene peaks, and a second fit of every layer would
    double the fit time."""
    g, dispatch = options.geometry, options.dispatch

    def worst_scene(f: Fitted, layers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        per_scene = np.stack([dispatch_score(f.map, s[layers], g, dispatch, f.static_sources) for s in scenes])
        return per_scene, per_scene.max(axis=0)

    all_layers = np.arange(scenes.shape[1])
    per_scene, worst = worst_scene(fitted, all_layers)
    chosen = np.flatnonzero((worst >= np.quantile(worst, 1.0 - WORST_REFIT_SHARE)) & (worst > 1.0 + options.tolerance))
    if chosen.size == 0:
        return fitted
    pull = weights[:, None] * (per_scene[:, chosen] - 1.0 + 1e-3)  # [K, n]: the further from balance, the heavier
    mix = (pull[:, :, None] * scenes[:, chosen]).sum(axis=0) / pull.sum(axis=0)[:, None]
    subset = Fitted(fitted.map[chosen], None if fitted.static_sources is None else fitted.static_sources[chosen])
    refit = _warm_refit(subset, mix, options)
    best, _ = pick_per_layer(subset, worst[chosen], refit, worst_scene(refit, chosen)[1])
    p2l = fitted.map.copy()
    p2l[chosen] = best.map
    sources = None
    if fitted.static_sources is not None:
        sources = fitted.static_sources.copy()
        sources[chosen] = best.static_sources
    return Fitted(p2l, sources)


def _warm_refit(fitted: Fitted, weights: np.ndarray, options: FitOptions) -> Fitted:
    """Refit a fit [n, P] to new weights [n, E] from where it is (same replica counts): swaps, and
    for ``static`` the table with them. Cheaper than a fit from scratch, which places every replica."""
    g = options.geometry
    if options.dispatch == "static":
        return fit_static_table(fitted.map, weights, options, fitted.static_sources)
    replicas = replica_counts(fitted.map, g.num_experts)
    moved, _ = refine(
        fitted.map, np.take_along_axis(weights / replicas, fitted.map, axis=1), g, options.max_rounds, options.tolerance
    )
    return Fitted(moved, None)
