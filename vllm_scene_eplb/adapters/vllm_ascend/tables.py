"""vLLM-Ascend 0.23.0.post1 (with vLLM 0.23): what our layout means in its terms (pure numpy).

vLLM-Ascend builds, per MoE layer k (construction order), a placement [ep, S] from the
``expert_map_path`` JSON, per-rank expert maps (logical id -> local slot, or -1) and a ``log2phy``
map per rank whose replica choice is the fixed formula of ``generate_log2phy_map``
(``ep_rank % c``, or ``(tp_rank + dp_rank + e) % c`` with TP>1), which ignores a replica on the
rank itself. Physical ids there are ``local + rank * S``, the same as our slot ids, so our static
table replaces its log2phy map entry for entry. The MTP layer (index == moe_layer_count) has no
row in the file: vLLM-Ascend gives it its default placement with the file's slot count.

``install_static_dispatch`` replaces ``generate_log2phy_map`` in vLLM-Ascend's ``eplb_utils`` with
our static table (local replica first, then even spread), computed from the same per-rank maps it
is given, so every layer vLLM-Ascend builds from an ``expert_map_path`` file dispatches our way.

What has run: these tables and the replacement against vLLM-Ascend's own ``eplb_utils.py`` on CPU
(tests); the startup wiring is in ``startup``. What has not: anything on Ascend
hardware; the observer on ``AscendFusedMoE`` and the export inside vLLM-Ascend are not built yet.
"""

from __future__ import annotations

import numpy as np

from ...dispatch import dynamic_tables, static_table
from ...errors import SceneEplbError
from ...layout import Geometry, Layout


def rank_expert_maps(layout: Layout) -> np.ndarray:
    """Per MoE layer and rank, logical expert -> local slot index or -1: int32 [L_moe, ep, E]
    (vLLM-Ascend's ``global_expert_map`` for each layer)."""
    g = layout.geometry
    rows = layout.physical_to_logical_map[list(layout.moe_layers)]
    S = g.slots_per_rank
    out = np.full((rows.shape[0], g.ep_size, g.num_experts), -1, dtype=np.int32)
    k, p = np.meshgrid(np.arange(rows.shape[0]), np.arange(g.num_physical), indexing="ij")
    out[k.ravel(), (p // S).ravel(), rows.ravel()] = (p % S).ravel()
    return out


def log2phy_static(layout: Layout) -> np.ndarray:
    """Our ``static`` choice per MoE layer, source rank and expert: global slot id, int32 [L_moe, ep, E]."""
    return static_table(layout.physical_to_logical_map, layout.geometry)[list(layout.moe_layers)].astype(np.int32)


def log2phy_dynamic(layout: Layout) -> tuple[np.ndarray, np.ndarray]:
    """Our ``dynamic`` tables per MoE layer: replica slots [L_moe, E, W] (-1 padded) and replicas per expert [L_moe, E]."""
    l2p, replicas = dynamic_tables(layout.physical_to_logical_map, layout.geometry.num_experts)
    idx = list(layout.moe_layers)
    return l2p[idx], replicas[idx]


def off_rank_with_local(choice: np.ndarray, layout: Layout) -> int:
    """(layer, rank, expert) triples whose chosen slot is on another rank although the rank holds a
    replica of that expert: ``choice`` is int [L_moe, ep, E] of global slot ids."""
    held = rank_expert_maps(layout) >= 0
    S = layout.geometry.slots_per_rank
    ranks = np.arange(layout.geometry.ep_size)[None, :, None]
    return int((held & (choice // S != ranks)).sum())


def static_log2phy_from_rank_maps(global_expert_map: np.ndarray, ep_rank: int) -> np.ndarray:
    """Our static choice for ``ep_rank`` from vLLM-Ascend's per-rank maps [ep, E] (local slot or -1):
    global slot ids int32 [E]."""
    maps = np.asarray(global_expert_map)
    ep, E = maps.shape
    S = int((maps[0] >= 0).sum())
    if ((maps >= 0).sum(axis=1) != S).any():
        raise SceneEplbError("vLLM-Ascend expert maps hold different slot counts per rank; expected S per rank")
    p2l = np.full(ep * S, -1, dtype=np.int64)
    r, e = np.nonzero(maps >= 0)
    p2l[r * S + maps[r, e]] = e
    if (p2l < 0).any():
        raise SceneEplbError("vLLM-Ascend expert maps leave a slot empty (a same-rank duplicate?)")
    g = Geometry(num_experts=E, num_redundant=ep * S - E, ep_size=ep)
    return static_table(p2l[None, :], g)[0, ep_rank].astype(np.int32)


def install_static_dispatch(eplb_utils, when=None) -> None:
    """Replace ``eplb_utils.generate_log2phy_map`` (vLLM-Ascend's fixed replica formula) with ours;
    with ``when`` (a callable), only while it returns True, else their formula runs."""
    import torch

    theirs = eplb_utils.generate_log2phy_map

    def generate_log2phy_map(global_expert_map, ep_rank, tp_size=None):
        if when is not None and not when():
            return theirs(global_expert_map, ep_rank, tp_size=tp_size)
        stacked = torch.stack(list(global_expert_map)) if isinstance(global_expert_map, (list, tuple)) else global_expert_map
        return torch.from_numpy(static_log2phy_from_rank_maps(stacked.cpu().numpy(), int(ep_rank)))

    generate_log2phy_map.__doc__ = install_static_dispatch.__doc__
    eplb_utils.generate_log2phy_map = generate_log2phy_map
