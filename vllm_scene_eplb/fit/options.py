"""What the fitter optimises for (``FitOptions``), what it returns (``Fitted``) and its version.

Shapes: a fitted ``map`` is int [L, P] (slot -> logical expert per layer); ``static_sources`` int
[L, P] (how many source ranks each slot serves under ``static`` dispatch) or None.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np

from .. import __version__
from ..errors import SceneEplbError
from ..layouts.dispatch import DISPATCH_ALGORITHMS
from ..layouts.layout import Geometry

FITTER_VERSION = f"{__version__}/fit-3"
# How a fit on several scenes weighs them: ``mean`` balances the weighted mix (each scene normalised
# per layer), ``worst`` also refits the layers whose worst scene scores highest toward that scene.
OBJECTIVES = ("mean", "worst")
# ``worst``: the share of layers (by worst-scene score) that get the second, reweighted fit.
WORST_REFIT_SHARE = 0.25
# Candidate risk weights for robust mode: weights = mean + kappa * std over the train passes.
ROBUST_KAPPAS = (0.0, 0.5, 1.0, 2.0)


@dataclass(frozen=True)
class FitOptions:
    """What the fitter optimises for: the geometry, the dispatch it will run under, robust mode.

    - ``geometry``: ``Geometry``: E experts, R redundant slots, ep_size ranks, num_nodes; the fitted
      map is [L, P] with P = E + R.
    - ``dispatch``: ``"static"`` or ``"dynamic"`` (``DISPATCH_ALGORITHMS``): the dispatch the layout
      will run under; ``static`` also fits the static table (``Layout.static_sources`` [L, P]) and
      spreads an expert's replicas over nodes.
    - ``robust``: fit the [T, L, E] series' risk weights ``mean + kappa * std`` per layer rather than
      the mean (see docs/fitter.md).
    - ``expert_groups``: the model's routing groups (DeepSeek-V3/R1: ``n_group`` = 8), dividing E;
      1: none. ``group_hedge`` (>= 0): the placement weight of a rank's load from an expert's own
      groups.
    - ``max_rounds`` (>= 0), ``tolerance``: the swap refinement's rounds and its stop: a layer within
      ``tolerance`` of perfect balance is done.
    - ``objective``: ``"mean"`` or ``"worst"`` (``OBJECTIVES``): with several scenes, balance their
      weighted mix, or also each layer's worst scene.

    Example: ``FitOptions(Geometry(256, 16, 16), dispatch="static", expert_groups=8)``: DeepSeek-V3
    on EP16 with one redundant slot per rank (P = 272, S = 17 slots per rank)."""

    geometry: Geometry
    dispatch: str = "static"
    robust: bool = False
    expert_groups: int = 1  # the model's routing groups (DeepSeek-V3/R1: n_group = 8); 1 = none
    group_hedge: float = 0.5  # placement weight of a rank's load from the expert's own blocks
    max_rounds: int = 256
    tolerance: float = 1e-4
    objective: str = "mean"  # several scenes: balance their weighted mix, or each layer's worst scene

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise SceneEplbError(f"objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        if self.expert_groups < 1 or self.geometry.num_experts % self.expert_groups:
            raise SceneEplbError(
                f"expert_groups must be >= 1 and divide {self.geometry.num_experts} experts, got {self.expert_groups}"
            )
        if not (np.isfinite(self.group_hedge) and self.group_hedge >= 0):
            raise SceneEplbError(f"group_hedge must be >= 0, got {self.group_hedge}")
        if self.dispatch not in DISPATCH_ALGORITHMS:
            raise SceneEplbError(f"dispatch must be one of {', '.join(DISPATCH_ALGORITHMS)}, got {self.dispatch!r}")
        if self.max_rounds < 0:
            raise SceneEplbError(f"max_rounds must be >= 0, got {self.max_rounds}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["geometry"] = self.geometry.to_dict()
        return d


class Fitted(NamedTuple):
    """What a fit stage returns before ``fit`` wraps it in a ``Layout``: ``map`` int64 [L, P] (the
    ``physical_to_logical_map``) and, for ``static`` dispatch, ``static_sources`` int64 [L, P] (source
    ranks per slot; None for ``dynamic``)."""

    map: np.ndarray
    static_sources: np.ndarray | None
