"""Per-layer before/after scores of a layout on counts: what `score`, `fit` and `report` print.

``SCORES`` is the one table of score names: the evaluation computes them, the CLI prints them and
the report labels them from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import SceneEplbError
from .counts import Counts
from .drafter import drafter_counts, drafter_layers_of, num_target_layers
from .layout import Layout, linear_map, same_rank_duplicates
from .peer import Peer, fit_peer, fitted_on
from .score import ideal_score, per_pass_score, static_score


@dataclass(frozen=True)
class ScoreName:
    """One score of a layout on counts: its key in JSON, its label in the report and in table headers."""

    key: str
    label: str
    column: str


# ``old`` is the linear layout (slot p holds p mod E) engines start from; ``vllm`` is vLLM's own
# policy fitted on the same counts (``peer.Peer``), scored under its even split; ``train``/``holdout``
# are the first and second half of the written ring entries.
SCORES = (
    ScoreName("old_train", "old (linear) layout, train (ideal)", "old train"),
    ScoreName("vllm_train", "vLLM's policy, train (ideal)", "vLLM train"),
    ScoreName("new_train", "new layout, train (ideal)", "new train"),
    ScoreName("old_holdout", "old (linear) layout, holdout (ideal)", "old holdout"),
    ScoreName("vllm_holdout", "vLLM's policy, holdout (ideal)", "vLLM holdout"),
    ScoreName("new_holdout", "new layout, holdout (ideal)", "new holdout"),
    ScoreName("new_static_train", "new layout, train, static dispatch", "new static"),
    ScoreName("new_per_pass_holdout", "new layout, holdout, expected per-pass peak", "per-pass holdout"),
)


@dataclass(frozen=True)
class Evaluation:
    """Scores per MoE layer, keyed by ``SCORES`` keys (arrays aligned with ``layers``; None where
    not observable: see ``not_observed``), plus replica statistics and provenance: the peer it was
    scored beside, whether the layout was fitted on these counts (None: the layout does not say)
    and how many ring entries the counts wrote."""

    layers: np.ndarray
    scores: dict[str, np.ndarray | None]
    max_replicas: np.ndarray
    replicated_experts: np.ndarray
    old_duplicates: int
    fingerprint: str | None
    layout_hash: str
    peer: Peer
    peer_duplicates: int
    fitted_scene: bool | None
    written_entries: int

    def summary(self) -> dict:
        """Median and worst layer of each score (None when not observed)."""

        def stats(a):
            return None if a is None else {"median": float(np.median(a)), "worst": float(np.max(a))}

        return {
            "layers": int(self.layers.size),
            **{s.key: stats(self.scores[s.key]) for s in SCORES},
            "old_same_rank_duplicates": self.old_duplicates,
            "vllm_policy": {
                "expert_groups": self.peer.expert_groups,
                "groups_from": self.peer.groups_from,
                "fitted_on": self.peer.fitted_on,
                "same_rank_duplicates": self.peer_duplicates,
            },
            "fitted_scene": self.fitted_scene,
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

    def scene_mark(self) -> str:
        """Whether the layout was fitted on these counts, in words."""
        return {True: "fitted on", False: "out of scene", None: "fit counts unknown"}[self.fitted_scene]

    def peer_line(self) -> str:
        """What vLLM's policy was fitted on and how, in one line."""
        p = self.peer
        return (
            f"vLLM's policy: fitted on {p.fitted_on}, {p.expert_groups} routing group(s) (from {p.groups_from}), "
            f"{self.peer_duplicates} same-rank duplicate(s)"
        )

    def observed(self) -> tuple[ScoreName, ...]:
        """The scores these counts observe: every one but the holdout scores of counts with fewer
        than two written ring entries (no second half to hold out)."""
        return tuple(s for s in SCORES if self.scores[s.key] is not None)

    def not_observed(self) -> str | None:
        """One line for the scores with no observation (``NOT_OBSERVED``, null in JSON), or None."""
        missing = [s.key for s in SCORES if self.scores[s.key] is None]
        if not missing:
            return None
        n = self.written_entries
        return (
            f"NOT_OBSERVED: {', '.join(missing)}: the counts hold {n} written ring entr{'y' if n == 1 else 'ies'}; "
            "a holdout is the second half of two or more (an SGLang [L, E] file is one)"
        )


def check_compatible(layout: Layout, counts: Counts) -> None:
    """Refuse to score a layout on counts of another model shape (the target's layers: a drafter's
    rows, on either side, are scored apart where both have them)."""
    if counts.num_experts != layout.geometry.num_experts:
        raise SceneEplbError(f"layout is for {layout.geometry.num_experts} experts, counts have {counts.num_experts}")
    if num_target_layers(counts) != layout.num_target_layers:
        raise SceneEplbError(f"layout has {layout.num_target_layers} layers, counts have {num_target_layers(counts)}")


def evaluate_drafter(layout: Layout, scenes: Sequence[Counts]) -> list[Evaluation] | None:
    """The drafter's MoE rows scored apart, one evaluation per scene (beside vLLM's policy fitted on
    the drafter's own counts), where the layout and every scene have the same drafter rows; else None
    (``drafter_gap`` says why)."""
    if not layout.drafter_layers or any(drafter_layers_of(c) != layout.drafter_layers for c in scenes):
        return None
    view, counts = layout.drafter_view(), [drafter_counts(c) for c in scenes]
    peer = fit_peer(view, counts)
    return [evaluate(view, c, peer) for c in counts]


def drafter_gap(layout: Layout, scenes: Sequence[Counts]) -> str | None:
    """Why a drafter's rows are not scored (the layout's or the counts' are missing), or None."""
    every = {drafter_layers_of(c) for c in scenes}
    recorded = sorted(every - {()})
    if layout.drafter_layers and () in every:
        which = "the counts have" if not recorded else "not every counts file has"
        return f"{which} no drafter rows: the layout's drafter layers {list(layout.drafter_layers)} are not scored"
    if recorded and recorded != [layout.drafter_layers]:
        return (
            f"the counts' drafter layers {[list(r) for r in recorded]} have no rows of the layout's "
            f"({list(layout.drafter_layers)}): not scored"
        )
    return None


def evaluate(layout: Layout, counts: Counts, peer: Peer) -> Evaluation:
    """Score ``layout``, the linear layout and ``peer`` (vLLM's policy, ``peer.fit_peer``) on the
    train and holdout halves of ``counts``."""
    check_compatible(layout, counts)
    if peer.map.shape != (len(layout.moe_layers), layout.geometry.num_physical):
        raise SceneEplbError(f"the peer's map is {list(peer.map.shape)}, not the layout's MoE rows by slots")
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
        "vllm_train": ideal_score(peer.map, w_train, g),
        "new_train": ideal_score(new, w_train, g),
        "old_holdout": None if w_hold is None else ideal_score(old, w_hold, g),
        "vllm_holdout": None if w_hold is None else ideal_score(peer.map, w_hold, g),
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
        peer=peer,
        peer_duplicates=same_rank_duplicates(peer.map, g),
        fitted_scene=fitted_on(layout, counts),
        written_entries=int(counts.written_entries().size),
    )
