"""A layout as advise prices it: its dispatch as an operator from logical counts to slot and rank loads.

Every pass's logical counts go through a layout's dispatch to per-rank loads, the same way for the
running layout (its dispatch, from the dump's metadata) and for the candidate: ``static`` sends each
source rank's share of an expert to the slot its table row names (the shares from the dump's
per-source counts ``Counts.sources`` where it has them, else 1/ep per source rank), ``dynamic`` 1/c
to each of an expert's c replicas. One yardstick for both. Pure numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import SceneEplbError
from ..layouts.counts import Counts
from ..layouts.dispatch import static_table
from ..layouts.layout import Geometry, Layout, linear_map, replica_counts


def slot_operator(p2l: np.ndarray, geometry: Geometry, dispatch: str, static_sources, shares: np.ndarray | None):
    """The share of every expert's assignments each slot gets: float [L, E, P] for map rows ``p2l``
    [L, P]. ``static``: source rank s's share ``shares`` [S, L, E] (None: 1/ep each) of expert e to
    the slot ``static_table`` names for (s, e); otherwise 1/c to each of the c replicas."""
    L, P = p2l.shape
    E, ep = geometry.num_experts, geometry.ep_size
    out = np.zeros((L, E, P))
    if dispatch == "static":
        table = static_table(p2l, geometry, static_sources)  # [L, ep, E]
        share = np.full((ep, L, E), 1.0 / ep) if shares is None else shares
        layers = np.broadcast_to(np.arange(L)[None, :, None], (ep, L, E))
        experts = np.broadcast_to(np.arange(E)[None, None, :], (ep, L, E))
        np.add.at(out, (layers, experts, table.transpose(1, 0, 2)), share)
        return out
    replicas = replica_counts(p2l, E)
    rows = np.repeat(np.arange(L), P)
    out[rows, p2l.ravel(), np.tile(np.arange(P), L)] = 1.0 / np.maximum(replicas[rows, p2l.ravel()], 1)
    return out


def source_shares(counts: Counts, rows: list[int], ep_size: int) -> np.ndarray | None:
    """Each source rank's share of every expert's recorded assignments [S, L_moe, E] from the dump's
    per-source counts; None without them (the even split then stands: 1/ep per source rank)."""
    if counts.sources is None:
        return None
    src = np.asarray(counts.sources, dtype=np.float64)[:, rows]
    if src.shape[0] != ep_size:
        raise SceneEplbError(
            f"the dump's per-source counts are for {src.shape[0]} source ranks, the layout for ep_size {ep_size}"
        )
    total = src.sum(axis=0, keepdims=True)
    even = np.full_like(src, 1.0 / ep_size)
    return np.where(total > 0, src / np.where(total > 0, total, 1.0), even)


@dataclass(frozen=True)
class Setup:
    """A layout as advise prices it: its map rows [L_moe, P], geometry, dispatch and slot operator [L_moe, E, P]."""

    p2l: np.ndarray
    geometry: Geometry
    dispatch: str
    operator: np.ndarray

    @classmethod
    def of(cls, layout: Layout | None, geometry: Geometry, dispatch: str, rows: list[int], shares) -> Setup:
        """``layout`` (None: the linear layout of ``geometry``) on the MoE ``rows``."""
        if layout is None:
            p2l, static_sources = linear_map(geometry, len(rows)), None
        else:
            p2l, static_sources = layout.physical_to_logical_map[rows], layout.static_sources_at(rows)
        return cls(p2l, geometry, dispatch, slot_operator(p2l, geometry, dispatch, static_sources, shares))

    def rank_loads(self, logical: np.ndarray) -> np.ndarray:
        """Per-rank loads [..., L, ep] of logical counts [..., L, E]."""
        g = self.geometry
        rank_op = self.operator.reshape(*self.operator.shape[:2], g.ep_size, g.slots_per_rank).sum(axis=3)
        return np.einsum("...le,ler->...lr", np.asarray(logical, dtype=np.float64), rank_op)

    def slot_active(self, logical: np.ndarray) -> np.ndarray:
        """The chance each slot [..., L, P] computes at least one assignment in a pass of logical
        counts [..., L, E]: a slot with share s of its expert's x assignments, 1 - (1 - s)^x under
        ``static`` (each assignment's source rank, hence its slot, at random) and min(x s, 1) under
        ``dynamic`` (min(x, c) of an expert's c replicas, one row each in turn)."""
        x = np.asarray(logical, dtype=np.float64)
        x = np.take_along_axis(x, np.broadcast_to(self.p2l, (*x.shape[:-1], self.p2l.shape[1])), axis=-1)
        share = np.take_along_axis(self.operator, self.p2l[:, None, :], axis=1)[:, 0, :]  # [L, P]
        return 1.0 - (1.0 - share) ** x if self.dispatch == "static" else np.minimum(x * share, 1.0)

    def per_rank(self, slots: np.ndarray) -> np.ndarray:
        """Per-slot values [..., L, P] summed per rank: [..., L, ep]."""
        g = self.geometry
        return slots.reshape(*slots.shape[:-1], g.ep_size, g.slots_per_rank).sum(axis=-1)

    def rank_active(self, logical: np.ndarray) -> np.ndarray:
        """Expected active slots per rank [..., L, ep] of passes' logical counts [..., L, E] (``slot_active``)."""
        return self.per_rank(self.slot_active(logical))


def running_setup(counts: Counts, running: Layout | None, candidate: Layout, rows: list[int], shares) -> Setup:
    """The running server's layout, from the dump's metadata (its layout hash, dispatch) and ``running``;
    the dump's ``physical_count`` must have its slots."""
    meta, E, ep = counts.meta, candidate.geometry.num_experts, candidate.geometry.ep_size
    dispatch = meta.get("dispatch") or "dynamic"
    if meta.get("layout_hash") is None:
        if running is not None:
            raise SceneEplbError("the dump was recorded on the linear layout (no layout_hash), but a running layout was given")
        setup = Setup.of(None, Geometry(E, (-E) % ep, ep), dispatch, rows, shares)
    elif running is None:
        raise SceneEplbError(f"the dump was recorded under layout {meta['layout_hash']}: give that layout (--running)")
    elif running.digest() != meta["layout_hash"]:
        raise SceneEplbError(f"the running layout is {running.digest()}, the dump was recorded under {meta['layout_hash']}")
    else:
        setup = Setup.of(running, running.geometry, dispatch, rows, shares)
    slots = setup.geometry.num_physical
    if counts.physical is not None and counts.physical.shape[2] != slots:
        raise SceneEplbError(f"the dump's physical_count has {counts.physical.shape[2]} slots, its running layout {slots}")
    return setup
