"""A speculative drafter's own MoE layers in counts: rows after the target model's layer axis.

A server that drafts with a model of its own (DeepSeek's MTP layer) runs that model's MoE layers
beside the target's. The recorder counts them apart, in the same file: one row per drafter MoE layer
after the target's layer axis, named by its model layer index (DeepSeek-V3's MTP layer is layer
``num_hidden_layers``), listed under ``DRAFTER_KEY`` in the metadata. ``moe_layers`` stays the
target's, so whatever reads a counts file's MoE rows reads the target's as before; the drafter's
are read apart (``drafter_counts``), never mixed in: they are a small share of a step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from .counts import Counts
from .layout import check_drafter_layers

DRAFTER_KEY = "drafter_layers"  # counts metadata: the drafter's MoE rows, the last rows of the layer axis


def drafter_layers_of(counts: Counts) -> tuple[int, ...]:
    """The drafter's MoE rows of ``counts`` (empty: none recorded), checked to be its last rows."""
    return check_drafter_layers(counts.meta.get(DRAFTER_KEY) or (), counts.num_layers, tuple(counts.meta.get("moe_layers") or ()))


def drafter_share(scenes: Sequence[Counts]) -> float:
    """The drafter's rows' share of every assignment in ``scenes`` (0 without drafter rows)."""
    total = sum(int(c.data.sum()) for c in scenes)
    drafter = sum(int(c.data[:, list(drafter_layers_of(c))].sum()) for c in scenes)
    return drafter / total if total else 0.0


def num_target_layers(counts: Counts) -> int:
    """The target model's rows of ``counts`` (its layer axis before the drafter's rows)."""
    return counts.num_layers - len(drafter_layers_of(counts))


def drafter_counts(counts: Counts) -> Counts:
    """The same counts with the drafter's rows as their MoE rows (``moe_layers``) and no drafter rows
    named: what scores and fits of the drafter's layers read, by the code that reads the target's."""
    meta = {k: v for k, v in counts.meta.items() if k != DRAFTER_KEY}
    return replace(counts, meta={**meta, "moe_layers": list(drafter_layers_of(counts))})


def target_counts(counts: Counts) -> Counts:
    """The target model's rows alone (the drafter's rows cut off): what a format without a place for
    the drafter's rows holds."""
    n = num_target_layers(counts)
    if n == counts.num_layers:
        return counts
    meta = {k: v for k, v in counts.meta.items() if k != DRAFTER_KEY}
    return Counts(
        counts.data[:, :n],
        meta,
        None if counts.physical is None else counts.physical[:, :n],
        None if counts.sources is None else counts.sources[:, :n],
    )
