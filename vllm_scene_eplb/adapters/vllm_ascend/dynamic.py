"""``dynamic`` dispatch on vLLM-Ascend: token row ``i`` of expert ``e`` goes to replica ``i mod c_e``.

vLLM-Ascend maps logical to physical ids with one fixed ``log2phy`` entry per expert and source rank
(``MoECommMethod.fused_experts``: ``log2phy[topk_ids]``), so a per-row choice cannot live in that map
alone. Instead, for a layer built with ``dispatch: dynamic``, its ``log2phy`` is the virtual-id map
of ``tables.dynamic_virtual_log2phy`` ([W * E], longer than E) and ``VirtualIds`` rewrites the ids
``select_experts`` returns (hooked by ``moe_hooks``) to ``e + E * (row mod c_e)``; their indexing
then yields replica ``row mod c_e``'s slot. Ids outside [0, E) pass unchanged.

Refused with it: models with zero experts (their ids above E are read before ``log2phy``). Also
refused at startup (``startup``): returning routed experts to clients, which would report the
virtual ids.
"""

from __future__ import annotations

import torch

from ...errors import SceneEplbError
from .tables import replicas_from_rank_maps


class VirtualIds:
    """One layer's id rewrite: logical ids [M, k] -> virtual ids of replica ``row mod c`` (fixed
    shape, no host sync, so graph capture records it)."""

    def __init__(self, replicas: torch.Tensor, num_experts: int):
        self.replicas, self.num_experts = replicas, num_experts

    def __call__(self, layer, topk_ids: torch.Tensor) -> torch.Tensor:
        ids = topk_ids.to(torch.int64)
        E = self.num_experts
        valid = (ids >= 0) & (ids < E)
        c = self.replicas.to(ids.device)[ids.clamp(0, E - 1)]
        rows = torch.arange(ids.shape[0], device=ids.device).unsqueeze(1)
        return torch.where(valid, ids + E * torch.remainder(rows, c), ids).to(topk_ids.dtype)


def virtual_ids_for(layer) -> VirtualIds | None:
    """The layer's id rewrite when its ``log2phy`` is a virtual-id map (built for ``dynamic``), else
    None; worked out from the per-rank maps vLLM-Ascend built for it (``runtime`` keeps it per layer)."""
    log2phy, maps = getattr(layer, "log2phy", None), getattr(layer, "global_expert_map", None)
    if log2phy is None or maps is None:
        return None
    maps = maps.cpu().numpy() if isinstance(maps, torch.Tensor) else maps
    num_experts = maps.shape[1]
    if log2phy.numel() <= num_experts:  # their map or our static table: one entry per expert
        return None
    if getattr(layer, "zero_expert_num", 0):
        raise SceneEplbError(
            'scene_eplb.dispatch "dynamic" on vLLM-Ascend does not support models with zero experts: use "static"'
        )
    return VirtualIds(torch.from_numpy(replicas_from_rank_maps(maps)).to(log2phy.device), num_experts)
