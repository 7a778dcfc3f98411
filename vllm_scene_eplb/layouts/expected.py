"""What a layout expects of its own scene, the metadata ``fit`` writes, ``formats`` checks and live
fitness judges against (pure numpy):

- ``EXPECTED_KEY``: the layout meta key that holds it;
- ``expected_score``: what ``fit`` stores in a layout (``meta[EXPECTED_KEY]``): the median
  and worst MoE layer of max/mean rank load on its own scene under its dispatch algorithm.
- ``layer_scores``: the same per layer for any counts, with the loaded layout (or the linear
  layout when none is loaded) and its dispatch algorithm.
"""

from __future__ import annotations

import numpy as np

from .layout import Geometry, Layout, linear_map
from .score import dispatch_score

EXPECTED_KEY = "expected_balancedness"  # the layout meta key, spelt as files written before the naming pass spell it


def layer_scores(layout: Layout | None, weights: np.ndarray, geometry: Geometry, dispatch: str) -> np.ndarray:
    """Max/mean rank load per MoE layer for counts ``weights`` [L_moe, E] (MoE layers in order):
    the layout's MoE rows, or the linear layout of ``geometry`` when ``layout`` is None."""
    weights = np.asarray(weights, dtype=np.float64)
    if len(weights) == 0:
        return np.zeros(0)
    if layout is None:
        return dispatch_score(linear_map(geometry, len(weights)), weights, geometry, dispatch)
    rows = list(layout.moe_layers)
    return dispatch_score(layout.physical_to_logical_map[rows], weights, geometry, dispatch, layout.static_sources_at(rows))


def expected_score(layout: Layout, total: np.ndarray, dispatch: str) -> dict:
    """What ``layout`` scores on its own scene (``total`` [L, E] on the layout's layer axis); None
    values when the scene routed nothing (no expectation, so no drift alarm)."""
    per_layer = layer_scores(layout, np.asarray(total)[list(layout.moe_layers)], layout.geometry, dispatch)
    if per_layer.size == 0:
        return {"dispatch": dispatch, "median": None, "worst": None}
    return {"dispatch": dispatch, "median": float(np.median(per_layer)), "worst": float(per_layer.max())}
