"""What a layout is scored beside: vLLM's own policy fitted on the same counts (``fit_peer``), and
which scenes the layout itself was fitted on (``fitted_on``, from the counts digests ``fit`` writes)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .counts import Counts
from .layout import Layout
from .scenes import normalise_weights, normalised_totals
from .vllm_policy import vllm_policy_map

FIT_DIGESTS_KEY = "source_counts_sha256"  # the layout meta key ``fit`` writes: one counts digest per scene


@dataclass(frozen=True)
class Peer:
    """vLLM's policy fitted beside a layout.

    - ``map``: int64 [L_moe, P], a slot's logical expert in each of the layout's MoE rows (in order);
      vLLM serves it with an even split over an expert's replicas (the ideal score).
    - ``expert_groups``, ``groups_from``: the routing groups it ran with, and where they came from.
    - ``fitted_on``: the counts it was fitted on, in words.
    """

    map: np.ndarray
    expert_groups: int
    groups_from: str
    fitted_on: str


def fitted_on(layout: Layout, counts: Counts) -> bool | None:
    """Whether ``layout`` was fitted on ``counts`` (its digest among those ``fit`` wrote); None
    where the layout names no fit counts (a bare or converted layout)."""
    digests = layout.meta.get(FIT_DIGESTS_KEY)
    return None if not digests else counts.digest() in digests


def fit_peer(layout: Layout, scenes: Sequence[Counts], expert_groups: int | None = None, groups_from: str = "") -> Peer:
    """vLLM's policy on the train half of the counts ``layout`` was fitted on, where all are among
    ``scenes`` (several: their per-layer normalised mix with the layout's scene weights, as the
    fitter mixes them), else on every scene of ``scenes`` (equal weights). Routing groups:
    ``expert_groups`` (from ``groups_from``) where given, else the layout's fit, else the counts'
    metadata (the recorder writes the served model's), else 1."""
    digests = layout.meta.get(FIT_DIGESTS_KEY) or []
    by_digest = {c.digest(): c for c in scenes}
    if digests and all(d in by_digest for d in digests):
        own, weights = [by_digest[d] for d in digests], layout.meta.get("scene_weights")
        where = "the counts the layout was fitted on"
    else:
        own, weights = list(scenes), None
        where = "every scene given (the layout's own fit counts are not all among them)"
    train = [c.split()[0] for c in own]
    if len(train) == 1:
        load = train[0].sum(axis=0)  # vLLM's load window: the counts themselves
    else:
        load = (normalise_weights(weights, len(train))[:, None, None] * normalised_totals(train)).sum(axis=0)
    if expert_groups is None:
        expert_groups, groups_from = _groups(layout, scenes)
    rows = list(layout.moe_layers)
    return Peer(vllm_policy_map(load[rows], layout.geometry, expert_groups), expert_groups, groups_from, where)


def _groups(layout: Layout, scenes: Sequence[Counts]) -> tuple[int, str]:
    """The routing groups the layout was fitted with, else those the counts recorded, else 1."""
    fitted = layout.meta.get("expert_groups")
    if isinstance(fitted, int) and fitted >= 1:
        return fitted, "the layout's fit"
    recorded = {c.meta.get("expert_groups") for c in scenes}
    groups = recorded.pop() if len(recorded) == 1 else None
    if isinstance(groups, int) and groups >= 1:
        return groups, "counts metadata"
    return 1, "default"
