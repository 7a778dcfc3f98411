"""vLLM-Ascend 0.23.0.post1 (with vLLM 0.23): what our layout means in its terms (pure numpy).

vLLM-Ascend builds, per MoE layer k (construction order), a placement [ep, S] from the
``expert_map_path`` JSON, per-rank expert maps (logical id -> local slot, or -1) and a ``log2phy``
map per rank whose replica choice is the fixed formula of ``generate_log2phy_map``
(``ep_rank % c``, or ``(tp_rank + dp_rank + e) % c`` with TP>1), which ignores a replica on the
rank itself. Physical ids there are ``local + rank * S``, the same as our slot ids, so our static
table replaces its log2phy map entry for entry. A drafter's MoE layers (the MTP layer, built after
the main model: index ``moe_layer_count`` on) have no row in the file, which vLLM-Ascend's format
cannot name; ``install_dispatch`` gives each the layout's drafter row instead of vLLM-Ascend's
default split.

``install_dispatch`` replaces ``expert_file_to_tensor`` (the drafter's rows) and
``generate_log2phy_map`` in vLLM-Ascend's ``eplb_utils`` with our static table (local replica first, then the layout's fitted source counts per replica), checked
against the per-rank maps it is given, so every layer vLLM-Ascend builds from an ``expert_map_path``
file dispatches exactly as the layout says (the file cannot carry the fitted table; the plugin
reads it from the scene-eplb layout). For ``dynamic`` it returns a map over virtual ids instead
(``dynamic_virtual_log2phy``; ``dynamic`` rewrites the ids to match).

What has run: these tables and the replacement against vLLM-Ascend's own code on CPU (tests); the
startup wiring is in ``startup``. What has not: anything on Ascend hardware.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ...errors import SceneEplbError
from ...layouts.dispatch import dynamic_tables, static_table
from ...layouts.layout import Geometry, Layout, replica_counts


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
    return static_table(layout.physical_to_logical_map, layout.geometry, layout.static_sources)[list(layout.moe_layers)].astype(
        np.int32
    )


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


def _map_from_rank_maps(global_expert_map: np.ndarray) -> tuple[np.ndarray, Geometry]:
    """Our one-layer map [1, P] and geometry from vLLM-Ascend's per-rank maps [ep, E] (local slot or -1)."""
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
    return p2l[None, :], Geometry(num_experts=E, num_redundant=ep * S - E, ep_size=ep)


def row_of_moe_index(layout: Layout, moe_index: int) -> int | None:
    """The layout row of vLLM-Ascend's MoE layer ``moe_index`` (construction order: the main model's
    MoE layers, then the drafter's), or None where the layout has no row for it."""
    rows = layout.moe_layers + layout.drafter_layers
    return rows[moe_index] if 0 <= moe_index < len(rows) else None


def drafter_placement(layout: Layout, moe_index: int) -> np.ndarray:
    """vLLM-Ascend's placement [ep, S] (the experts of each rank's local slots, int32) of the drafter's
    MoE layer ``moe_index`` (past the main model's), from the layout's drafter row; refused, naming
    the layer, where the layout has no drafter row for it."""
    row = row_of_moe_index(layout, moe_index)
    if row is None or moe_index < len(layout.moe_layers):
        raise SceneEplbError(
            f"vLLM-Ascend builds a speculative drafter's MoE layer (MoE layer {moe_index}, after the main model's "
            f"{len(layout.moe_layers)}), the layout has drafter rows {list(layout.drafter_layers)}: fit the layout on "
            "a dump recorded with this drafter on (or with `scene-eplb fit --drafter-layers N`)"
        )
    g = layout.geometry
    return layout.physical_to_logical_map[row].reshape(g.ep_size, g.slots_per_rank).astype(np.int32)


def static_log2phy_from_rank_maps(
    global_expert_map: np.ndarray, ep_rank: int, layout: Layout | None = None, moe_index: int | None = None
) -> np.ndarray:
    """Our static choice for ``ep_rank`` from vLLM-Ascend's per-rank maps [ep, E]: global slot ids
    int32 [E]. Given the layout and the MoE layer's index, the layout's fitted table for that layer
    (a main model's or a drafter's row: the maps must be that row's); else the even split."""
    p2l, g = _map_from_rank_maps(global_expert_map)
    sources = None
    row = None if layout is None or moe_index is None else row_of_moe_index(layout, moe_index)
    if layout is not None and row is not None:
        if not np.array_equal(layout.physical_to_logical_map[row], p2l[0]):
            raise SceneEplbError(f"vLLM-Ascend's expert map for MoE layer {moe_index} differs from the layout's row {row}")
        sources = layout.static_sources_at([row])
    return static_table(p2l, g, sources)[0, ep_rank].astype(np.int32)


def _moe_index_being_built() -> int | None:
    """The MoE layer index (``layer_id``) of the vLLM-Ascend ``init_eplb_config`` call that is
    asking for a log2phy map, read from its frame: the layer is not an argument of
    ``generate_log2phy_map``, and ``init_eplb_config`` is bound by name in its fused-MoE modules,
    so wrapping it would miss them."""
    frame = sys._getframe(2)
    if frame.f_code.co_name != "init_eplb_config":
        return None
    layer_id = frame.f_locals.get("layer_id")
    return int(layer_id) if isinstance(layer_id, int) else None


def dynamic_virtual_log2phy(global_expert_map: np.ndarray) -> np.ndarray:
    """``dynamic`` dispatch in vLLM-Ascend's terms, from its per-rank maps [ep, E]: a log2phy map
    over virtual ids, int32 [W * E], where virtual id ``e + E * j`` is replica ``j`` of expert ``e``
    (``j`` taken modulo its replica count, so every entry is a slot holding ``e``). ``VirtualIds``
    turns a token row's logical id into the virtual id of replica ``row mod c``; vLLM-Ascend's own
    ``log2phy[topk_ids]`` then yields the physical slot. The same on every rank."""
    p2l, g = _map_from_rank_maps(global_expert_map)
    l2p, replicas = dynamic_tables(p2l, g.num_experts)
    l2p, replicas = l2p[0], replicas[0]  # [E, W], [E]
    j = np.arange(l2p.shape[1])[None, :] % replicas[:, None]
    return np.take_along_axis(l2p, j, axis=1).T.reshape(-1).astype(np.int32)


def replicas_from_rank_maps(global_expert_map: np.ndarray) -> np.ndarray:
    """Replicas per logical expert from vLLM-Ascend's per-rank maps [ep, E]: int64 [E]."""
    p2l, g = _map_from_rank_maps(global_expert_map)
    return replica_counts(p2l, g.num_experts)[0]


@dataclass(frozen=True)
class AscendDispatch:
    """What the config the model is being built with asks of vLLM-Ascend's log2phy maps."""

    layout: Layout
    algorithm: str  # static | dynamic


def install_dispatch(eplb_utils, dispatch_now: Callable[[], AscendDispatch | None]) -> None:
    """Replace ``eplb_utils.generate_log2phy_map`` (vLLM-Ascend's fixed replica formula) with ours
    while ``dispatch_now()`` returns a dispatch: ``static``, the layout's static table (its fitted
    one, per MoE layer); ``dynamic``, the virtual-id map of ``dynamic_virtual_log2phy`` (the
    ``moe_hooks`` wrapper makes the ids virtual). When it returns None, their formula runs. Also
    replace ``eplb_utils.expert_file_to_tensor`` so that a drafter's MoE layer (an index past the
    file's ``moe_layer_count``) is placed by the layout's drafter row (``drafter_placement``), not by
    vLLM-Ascend's default split; ``init_eplb_config`` looks both up in ``eplb_utils`` when it runs."""
    import torch

    theirs, theirs_file = eplb_utils.generate_log2phy_map, eplb_utils.expert_file_to_tensor

    def expert_file_to_tensor(expert_map_path, layer_id):
        plan = dispatch_now()
        if plan is None or layer_id < len(plan.layout.moe_layers):
            return theirs_file(expert_map_path, layer_id)
        return torch.from_numpy(drafter_placement(plan.layout, int(layer_id))), plan.layout.geometry.num_physical

    def generate_log2phy_map(global_expert_map, ep_rank, tp_size=None):
        plan = dispatch_now()
        if plan is None:
            return theirs(global_expert_map, ep_rank, tp_size=tp_size)
        stacked = torch.stack(list(global_expert_map)) if isinstance(global_expert_map, (list, tuple)) else global_expert_map
        maps = stacked.cpu().numpy()
        if plan.algorithm == "dynamic":
            return torch.from_numpy(dynamic_virtual_log2phy(maps))
        return torch.from_numpy(static_log2phy_from_rank_maps(maps, int(ep_rank), plan.layout, _moe_index_being_built()))

    generate_log2phy_map.__doc__ = expert_file_to_tensor.__doc__ = install_dispatch.__doc__
    eplb_utils.generate_log2phy_map, eplb_utils.expert_file_to_tensor = generate_log2phy_map, expert_file_to_tensor
