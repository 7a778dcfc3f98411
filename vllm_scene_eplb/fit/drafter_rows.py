"""A drafter's rows where no counts say how its MoE layers route.

A drafter's MoE layers (``layouts.drafter``) are fitted from their own counts like any row. Where
no scene recorded them (a dump without the drafter on, ``fit --drafter-layers N``, or a drafter row
that routed nothing), their row is the linear row (slot p < E holds expert p) with the R redundant
slots given to the target's hottest experts (its MoE rows' normalised loads summed), each on a rank
that does not hold that expert yet: a guess, which the layout's metadata and ``fit`` say is one.
"""

from __future__ import annotations

import numpy as np

from ..layouts.layout import Geometry
from .options import Fitted
from .static_table import even_sources

DRAFTER_META = "drafter"  # the layout meta key: the drafter's rows, which were fitted on counts and which guessed
GUESS = "linear, the redundant slots given to the target's hottest experts (no drafter counts)"


def hot_linear_row(geometry: Geometry, hotness: np.ndarray) -> np.ndarray:
    """The linear row [P] with each redundant slot, in slot order, holding the expert of the highest
    ``hotness`` [E] per replica among those its rank does not hold yet (ties to the lower id)."""
    E, S = geometry.num_experts, geometry.slots_per_rank
    row = np.arange(geometry.num_physical) % E
    replicas = np.ones(E)
    hot = np.asarray(hotness, dtype=np.float64)
    for p in range(E, geometry.num_physical):
        held = row[(p // S) * S : p]  # the experts this slot's rank holds in its slots before p
        share = np.where(np.isin(np.arange(E), held), -np.inf, hot / replicas)
        row[p] = int(np.argmax(share))
        replicas[row[p]] += 1
    return row


def guessed_rows(fitted: Fitted, rows: list[int], hotness: np.ndarray, geometry: Geometry) -> Fitted:
    """``fitted`` with ``rows`` (each at most one past its last row) given ``hot_linear_row``."""
    row = hot_linear_row(geometry, hotness)
    p2l = np.vstack([fitted.map, np.zeros((max(rows, default=-1) + 1 - len(fitted.map), len(row)), dtype=np.int64)])
    p2l[rows] = row
    sources = None
    if fitted.static_sources is not None:
        sources = np.vstack([fitted.static_sources, np.ones((len(p2l) - len(fitted.map), len(row)), dtype=np.int64)])
        sources[rows] = even_sources(row[None], geometry)[0]
    return Fitted(p2l, sources)
