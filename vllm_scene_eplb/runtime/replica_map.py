"""Logical -> physical expert ids inside the forward pass, by the ``static`` or ``dynamic`` algorithm.

The tables come from the pure core (``dispatch.py``); this module only turns them into tensors and
applies them with fixed-shape indexing (traceable, no host sync). Every rank builds the same tables
from the same layout and sees the same token rows, so every rank makes the same choice for the
same (token, expert): each assignment is computed by exactly one slot.

Source rank of a token row: when every rank routes the same batch (TP>1, DP=1), rows are split
evenly, row i of M belongs to rank i * ep // M (as sequence-parallel MoE splits them), so a hot
expert's tokens still spread over its replicas the way the static table says.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..dispatch import DISPATCH_ALGORITHMS, dynamic_tables, static_table
from ..layout import Layout


@dataclass
class LayerReplicaMap:
    """One MoE layer's dispatch: ``static`` [ep, E] table or ``dynamic`` l2p [E, W] + replicas [E]."""

    algorithm: str
    ep_size: int
    static: torch.Tensor | None = None
    l2p: torch.Tensor | None = None
    replicas: torch.Tensor | None = None

    def __call__(self, topk_ids: torch.Tensor) -> torch.Tensor:
        """Physical slot ids for logical ``topk_ids`` [M, k], same dtype and shape."""
        ids = topk_ids.to(torch.int64)
        rows = torch.arange(ids.shape[0], device=ids.device).unsqueeze(1)
        if self.algorithm == "static":
            src = torch.div(rows * self.ep_size, max(ids.shape[0], 1), rounding_mode="floor")
            phys = self.static[src.expand_as(ids), ids]
        else:
            replica = torch.remainder(rows, self.replicas[ids])
            phys = self.l2p[ids, replica]
        return phys.to(topk_ids.dtype)


def layer_maps(layout: Layout, algorithm: str, device: torch.device | str = "cpu") -> dict[int, LayerReplicaMap]:
    """A replica map for every MoE layer of ``layout``, keyed by model layer index."""
    if algorithm not in DISPATCH_ALGORITHMS:
        raise ValueError(f"dispatch must be one of {DISPATCH_ALGORITHMS}, got {algorithm!r}")
    p2l, g = layout.physical_to_logical_map, layout.geometry
    ep = g.ep_size
    maps: dict[int, LayerReplicaMap] = {}
    if algorithm == "static":
        table = static_table(p2l, g)
        for layer in layout.moe_layers:
            maps[layer] = LayerReplicaMap("static", ep, static=_tensor(table[layer], device))
    else:
        l2p, replicas = dynamic_tables(p2l, g.num_experts)
        for layer in layout.moe_layers:
            maps[layer] = LayerReplicaMap("dynamic", ep, l2p=_tensor(np.maximum(l2p[layer], 0), device),
                                          replicas=_tensor(replicas[layer], device))
    return maps


def _tensor(a: np.ndarray, device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(device)
