"""The pair's predictions from its model: the throughput ratio of a layout's node ratios
(``ratio``), the layouts there are to price, and the throughput's elasticity in each node's
speed. Pure numpy."""

from __future__ import annotations

import math

from ...protocol.pair import PAIR_LAYOUTS
from .inputs import NodeEffect, PairLoad
from .solver import Network, load_throughput

ELASTICITY_STEP = 1.01  # the node ratio an elasticity dlnX/dln r is taken at


def ratio(net: Network, load: PairLoad, r_p: float, r_d: float) -> float:
    """The load's throughput ratio with P's and D's node ratios ``r_p`` and ``r_d`` (> 1 faster)."""
    return load_throughput(net.scaled(r_p, r_d), load) / load_throughput(net, load)


def layouts(p_effect: NodeEffect | None, d_effect: NodeEffect | None) -> list[str]:
    """The layouts there are to price (``PAIR_LAYOUTS``' order): P's, D's and both, as the effects given allow."""
    return [k for k, on in zip(PAIR_LAYOUTS, (p_effect, d_effect, p_effect and d_effect)) if on]


def node_ratios(layout: str, r_p: float, r_d: float) -> tuple[float, float]:
    """P's and D's node ratios under ``layout``: the ratio of each node it changes, 1 elsewhere."""
    return (r_p if layout in ("p", "both") else 1.0, r_d if layout in ("d", "both") else 1.0)


def elasticities(net: Network, load: PairLoad) -> tuple[float, float]:
    """dlnX / dln r of P's and of D's node ratio at the running layouts."""
    step = math.log(ELASTICITY_STEP)
    return (
        math.log(ratio(net, load, ELASTICITY_STEP, 1.0)) / step,
        math.log(ratio(net, load, 1.0, ELASTICITY_STEP)) / step,
    )
