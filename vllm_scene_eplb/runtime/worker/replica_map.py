"""Logical -> physical expert ids inside the forward pass, by the ``static`` or ``dynamic`` algorithm.

The tables come from the pure core (``dispatch.py``); this module only turns them into tensors and
applies them with fixed-shape indexing (traceable, no host sync). Every rank builds the same tables
from the same layout and sees the same token rows, so every rank makes the same choice for the
same (token, expert): each assignment is computed by exactly one slot.

Source rank of a token row (``SourceRanks``): the rank's routed batch comes from a group of
``span`` EP ranks starting at ``base`` that all see it, and its rows are split evenly over them:
row i of M belongs to rank ``base + i * span // M`` (as sequence-parallel MoE splits them), so a
hot expert's tokens still spread over its replicas the way the static table says.
- TP>1, DP=1: every rank routes the same batch: base 0, span = ep_size;
- DP x TP (DP attention): DP rank d routes its own tokens, seen by its TP ranks, whose EP ranks
  are d*tp .. d*tp+tp-1 in vLLM's numbering: base = d*tp, span = tp (DP16/TP1: the rank itself);
- sequence-parallel MoE: each rank routes its own rows: base = its EP rank, span 1.

The rows a rank routes itself (``own_source_span``) are those whose source rank is the rank: the rows
whose replica choice its own static table row makes, and which its per-source counts count.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ...layouts.dispatch import DISPATCH_ALGORITHMS, dynamic_tables, static_table
from ...layouts.layout import Layout


@dataclass(frozen=True)
class SourceRanks:
    """The EP ranks that see this rank's routed batch: ``span`` ranks from ``base``."""

    base: int
    span: int


def row_sources(source: SourceRanks, num_rows: int, device) -> torch.Tensor:
    """The source rank of each row of a routed batch of ``num_rows`` rows: int64 [num_rows], row i
    ``base + i * span // num_rows`` (fixed-shape, traceable)."""
    rows = torch.arange(num_rows, device=device)
    return source.base + torch.div(rows * source.span, max(num_rows, 1), rounding_mode="floor")


def own_source_span(source: SourceRanks, rank: int, num_rows: int) -> tuple[int, int]:
    """The rows [lo, hi) of a routed batch of ``num_rows`` rows whose source rank (``row_sources``)
    is EP rank ``rank``: the rows it routes itself. Row i has source base + k exactly where
    ceil(k * M / span) <= i < ceil((k + 1) * M / span); host integers, so the rows are a slice (a view)."""
    k = rank - source.base
    if not 0 <= k < source.span:
        return 0, 0
    return -(-k * num_rows // source.span), -(-(k + 1) * num_rows // source.span)


@dataclass
class LayerReplicaMap:
    """One MoE layer's dispatch: ``static`` [ep, E] table or ``dynamic`` l2p [E, W] + replicas [E]."""

    algorithm: str
    source: SourceRanks
    static: torch.Tensor | None = None
    l2p: torch.Tensor | None = None
    replicas: torch.Tensor | None = None

    def __call__(self, topk_ids: torch.Tensor) -> torch.Tensor:
        """Physical slot ids for logical ``topk_ids`` [M, k], same dtype and shape. A negative id (the
        -1 vLLM's top-k writes for padding rows) stays as it is, not dispatched: indexing with it
        would wrap to expert E-1 and send every padding row to that expert's replica."""
        ids = topk_ids.to(torch.int64)
        sentinel = ids < 0
        safe = ids.clamp(min=0)  # a sentinel looks up expert 0, then is put back: fixed shape, no sync
        if self.algorithm == "static":
            assert self.static is not None, "a static map carries its table"
            src = row_sources(self.source, ids.shape[0], ids.device).unsqueeze(1)
            phys = self.static[src.expand_as(safe), safe]
        else:
            assert self.replicas is not None and self.l2p is not None, "a dynamic map carries l2p and replicas"
            rows = torch.arange(ids.shape[0], device=ids.device).unsqueeze(1)
            replica = torch.remainder(rows, self.replicas[safe])
            phys = self.l2p[safe, replica]
        return torch.where(sentinel, ids, phys).to(topk_ids.dtype)


def layer_maps(
    layout: Layout, algorithm: str, device: torch.device | str = "cpu", source: SourceRanks | None = None
) -> dict[int, LayerReplicaMap]:
    """A replica map for every MoE layer of ``layout``, the drafter's included, keyed by model layer
    index; ``source`` defaults to every EP rank seeing the same batch (TP>1, DP=1)."""
    if algorithm not in DISPATCH_ALGORITHMS:
        raise ValueError(f"dispatch must be one of {DISPATCH_ALGORITHMS}, got {algorithm!r}")
    p2l, g = layout.physical_to_logical_map, layout.geometry
    source = source or SourceRanks(0, g.ep_size)
    if source.base < 0 or source.span < 1 or source.base + source.span > g.ep_size:
        raise ValueError(f"source ranks {source} do not fit ep_size {g.ep_size}")
    maps: dict[int, LayerReplicaMap] = {}
    layers = layout.moe_layers + layout.drafter_layers
    if algorithm == "static":
        table = static_table(p2l, g, layout.static_sources)
        for layer in layers:
            maps[layer] = LayerReplicaMap("static", source, static=_tensor(table[layer], device))
    else:
        l2p, replicas = dynamic_tables(p2l, g.num_experts)
        for layer in layers:
            maps[layer] = LayerReplicaMap(
                "dynamic", source, l2p=_tensor(np.maximum(l2p[layer], 0), device), replicas=_tensor(replicas[layer], device)
            )
    return maps


def _tensor(a: np.ndarray, device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(device)
