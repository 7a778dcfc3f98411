"""Per-layer before/after scores of a layout on counts: what `score`, `fit` and `report` print.

``SCORES`` is the one table of score names: the evaluation computes them, the CLI prints them and
the report labels them from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import SceneEplbError
from .counts import Counts
from .layout import Layout, linear_map, same_rank_duplicates
from .score import ideal_score, per_pass_score, static_score


@dataclass(frozen=True)
class ScoreName:
    """One score of a layout on counts: its key in JSON, its label in the report and in table headers."""

    key: str
    label: str
    column: str


# ``old`` is the linear layout (slot p holds p mod E) engines start from; ``train``/``holdout``
# are the first and second half of the written ring entries.
SCORES = (
    ScoreName("old_train", "old layout, train (ideal)", "old train"),
    ScoreName("new_train", "new layout, train (ideal)", "new train"),
    ScoreName("old_holdout", "old layout, holdout (ideal)", "old holdout"),
    ScoreName("new_holdout", "new layout, holdout (ideal)", "new holdout"),
    ScoreName("new_static_train", "new layout, train, static dispatch", "new static"),
    ScoreName("new_per_pass_holdout", "new layout, holdout, expected per-pass peak", "per-pass holdout"),
)


@dataclass(frozen=True)
class Evaluation:
    """Scores per MoE layer, keyed by ``SCORES`` keys (arrays aligned with ``layers``; None where
    not observable), plus replica statistics and provenance."""

    layers: np.ndarray
    scores: dict[str, np.ndarray | None]
    max_replicas: np.ndarray
    replicated_experts: np.ndarray
    old_duplicates: int
    fingerprint: str | None
    layout_hash: str

    def summary(self) -> dict:
        """Median and worst layer of each score (None when not observed)."""

        def stats(a):
            return None if a is None else {"median": float(np.median(a)), "worst": float(np.max(a))}

        return {
            "layers": int(self.layers.size),
            **{s.key: stats(self.scores[s.key]) for s in SCORES},
            "old_same_rank_duplicates": self.old_duplicates,
            "fingerprint": self.fingerprint,
            "layout_hash": self.layout_hash,
        }

    def rows(self) -> list[dict]:
        """One dict per MoE layer, for JSON output and tables."""

        def at(a, i):
            return None if a is None else float(a[i])

        return [
            {
                "layer": int(layer),
                **{s.key: at(self.scores[s.key], i) for s in SCORES},
                "max_replicas": int(self.max_replicas[i]),
                "replicated_experts": int(self.replicated_experts[i]),
            }
            for i, layer in enumerate(self.layers)
        ]


def check_compatible(layout: Layout, counts: Counts) -> None:
    """Refuse to score a layout on counts of another model shape."""
    if counts.num_experts != layout.geometry.num_experts:
        raise SceneEplbError(f"layout is for {layout.geometry.num_experts} experts, counts have {counts.num_experts}")
    if counts.num_layers != layout.num_layers:
        raise SceneEplbError(f"layout has {layout.num_layers} layers, counts have {counts.num_layers}")


def evaluate(layout: Layout, counts: Counts) -> Evaluation:
    """Score ``layout`` and the linear layout on the train and holdout halves of ``counts``."""
    check_compatible(layout, counts)
    g = layout.geometry
    layers = np.asarray(layout.moe_layers, dtype=np.int64)
    new = layout.physical_to_logical_map[layers]
    old = linear_map(g, layers.size)
    train, holdout = counts.split()
    w_train = train.sum(axis=0)[layers]
    w_hold = None if holdout is None else holdout.sum(axis=0)[layers]
    reps = layout.replica_counts()[layers]
    scores = {
        "old_train": ideal_score(old, w_train, g),
        "new_train": ideal_score(new, w_train, g),
        "old_holdout": None if w_hold is None else ideal_score(old, w_hold, g),
        "new_holdout": None if w_hold is None else ideal_score(new, w_hold, g),
        "new_static_train": static_score(new, w_train, g, layout.static_sources_at(layers)),
        "new_per_pass_holdout": None if holdout is None else per_pass_score(new, holdout[:, layers], g),
    }
    assert tuple(scores) == tuple(s.key for s in SCORES)
    return Evaluation(
        layers=layers,
        scores=scores,
        max_replicas=reps.max(axis=1),
        replicated_experts=(reps > 1).sum(axis=1),
        old_duplicates=same_rank_duplicates(old, g),
        fingerprint=layout.meta.get("fingerprint"),
        layout_hash=layout.digest(),
    )
