"""The live totals: cumulative counts of every real pass, never stopped, read between steps.

They feed live fitness and never sync the host in the forward; a server can turn them off
(``live_counts`` off: decode nodes, whose steps are many and small), and the recorder still runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...protocol import RankPassGroups
from .id_space import IdSpace
from .moe_timing import MoeTimes
from .pass_counts import PassCounts


@dataclass(frozen=True)
class LiveTotalsSnapshot:
    """A rank's cumulative live counts, read between steps: logical [L, E], physical [L, P] (None
    where the adapter does not see physical ids) and passes. With ``time_moe``: the seconds of each
    layer's local expert computation [L] over the ``moe_passes`` passes that ran it (dummy passes
    too: an idle DP engine's experts still compute its peers' tokens), over the ``steps`` real
    steps, their wall time and the MoE seconds within it, and the ``gap_seconds`` of the ``gaps``
    busy pauses between steps (``moe_timing``); where the observer counts them, the stepping
    thread's run-queue ``wait_seconds`` in the real steps, the ``active_slots`` [L] of this rank's
    local slots summed over its real passes and its passes by size (``groups``: ``slot_activity``)."""

    logical: torch.Tensor
    physical: torch.Tensor | None
    passes: int
    moe_seconds: list[float] | None
    moe_passes: int
    steps: int
    step_seconds: float
    step_moe_seconds: float
    gap_seconds: float
    gaps: int
    own: torch.Tensor | None = None  # logical [L, E] of this rank's own rows (the static table's source rows)
    wait_seconds: float | None = None
    active_slots: list[int] | None = None
    groups: RankPassGroups | None = None


class LiveTotals:
    """Cumulative counts [L, W + 2] int64 ([0, W + 2] when off) and the own rows' (with ``sources``
    and on), over ``passes`` real passes."""

    def __init__(self, row_shape: tuple[int, int], device: torch.device | str, on: bool = True, sources: bool = False):
        self.on = on
        self.counts = torch.zeros(row_shape if on else (0, row_shape[1]), dtype=torch.int64, device=device)
        self.sources = torch.zeros(row_shape, dtype=torch.int64, device=device) if sources and on else None
        self.passes = 0

    def add(self, passes: PassCounts) -> None:
        """Add a real pass (host, between passes)."""
        if self.on:
            self.counts.add_(passes.counts)
            self.passes += 1
        if self.sources is not None and passes.sources is not None:
            self.sources.add_(passes.sources)

    def read(self, space: IdSpace, times: MoeTimes) -> LiveTotalsSnapshot | None:
        """The totals on CPU with ``times`` beside them (between steps only); None when off."""
        if not self.on:
            return None
        logical, physical = space.views(self.counts)
        own = space.views(self.sources)[0] if self.sources is not None else logical
        return LiveTotalsSnapshot(logical, physical, self.passes, *times, own)
