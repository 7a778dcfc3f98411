"""Stage 2, placement with the group hedge: which rank each replica goes to.

``place(replicas [L, E], weights [L, E], geometry, spread_nodes, groups, hedge) -> int [L, P]``:
replicas heaviest first onto the least loaded rank with a free slot that does not hold the expert
yet (with several nodes, a node without a replica of the expert first). With routing groups, a
rank's load also counts, at ``hedge`` weight, the experts that share hedging blocks with the one
being placed (its group and the group's halvings: ``hedge_kernel``), because load moves between
blocks of neighbouring ids from scene to scene; a dead end is repaired by a swap (``_repair_dead_end``).
"""

from __future__ import annotations

import numpy as np

from ..errors import SceneEplbError
from ..layouts.layout import Geometry


def hedge_kernel(num_experts: int, groups: int) -> tuple[np.ndarray, np.ndarray]:
    """For every expert, the experts of its routing group and how many hedging blocks it shares
    with each: the group itself and its halvings down to id pairs. Returns (members int [E, G],
    shared int [E, G]); both have no columns when ``groups`` is 1.

    Why: between real DeepSeek-V3 scenes, load moves between blocks of neighbouring expert ids
    (group-limited routing), the more so the bigger the block; out-of-scene noise is not
    independent per expert, so a placement that spreads each block evenly over ranks is safer
    (``benchmarks/scene_structure.py`` measures it).
    """
    if groups <= 1:
        empty = np.zeros((num_experts, 0), dtype=np.int64)
        return empty, empty
    size = num_experts // groups
    members = (np.arange(num_experts) // size * size)[:, None] + np.arange(size)
    shared = np.zeros(members.shape, dtype=np.int64)
    block = size
    while block >= 2:
        shared += (np.arange(num_experts)[:, None] // block) == (members // block)
        block //= 2
    return members, shared


def _expand_items(replicas: np.ndarray, share: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All replicas of every layer as (expert id, load), heaviest first: two [L, P] arrays."""
    L, E = replicas.shape
    experts = np.repeat(np.tile(np.arange(E), L), replicas.ravel()).reshape(L, -1)
    loads = np.take_along_axis(share, experts, axis=1)
    order = np.argsort(-loads, axis=1, kind="stable")
    return np.take_along_axis(experts, order, axis=1), np.take_along_axis(loads, order, axis=1)


def _repair_dead_end(layer, e, x, item_rank, experts, loads, k, rank_load, fill, holds, S):
    """Place replica ``e`` when every rank with a free slot already holds it, by moving one placed
    replica y from a full rank q to a free rank f (which must not hold y) and putting e on q."""
    free = np.flatnonzero(fill[layer] < S)
    best = None
    for q in np.flatnonzero(~holds[layer, e] & (fill[layer] >= S)):
        for i in np.flatnonzero(item_rank[layer, :k] == q):
            y, v = experts[layer, i], loads[layer, i]
            for f in free:
                if holds[layer, y, f]:
                    continue
                cost = max(rank_load[layer, q] - v + x, rank_load[layer, f] + v)
                if best is None or cost < best[0]:
                    best = (cost, q, i, f, y, v)
    if best is None:  # cannot happen while replicas per expert <= ep_size; kept as a hard stop
        raise SceneEplbError(f"layer {layer}: no valid placement for a replica of expert {e}")
    _, q, i, f, y, v = best
    item_rank[layer, i] = f
    holds[layer, y, q], holds[layer, y, f] = False, True
    rank_load[layer, q] += x - v
    rank_load[layer, f] += v
    fill[layer, f] += 1
    return q


def place(
    replicas: np.ndarray, weights: np.ndarray, geometry: Geometry, spread_nodes: bool, groups: int = 1, hedge: float = 0.0
) -> np.ndarray:
    """Greedy placement: replicas heaviest first onto the least-loaded rank with a free slot that
    does not hold the expert yet. With several nodes, a node without a replica of the expert is
    preferred: always when ``spread_nodes`` (static dispatch serves each node from its own replica,
    so spreading evens the replicas' shares), else only to break near-ties (within 1e-6 of the
    mean rank load), which keeps traffic node-local at no cost in balance.

    With ``groups`` > 1 expert groups, a rank's cost also counts ``hedge`` times its load from
    each of the expert's blocks (see ``hedge_kernel``), so every rank holds a similar share
    of every block and a scene that shifts load between blocks moves all ranks alike.

    Returns physical_to_logical_map int [L, P].
    """
    L, E = replicas.shape
    ep, S = geometry.ep_size, geometry.slots_per_rank
    share = weights / replicas
    experts, loads = _expand_items(replicas, share)
    P = experts.shape[1]
    rows = np.arange(L)
    rank_load = np.zeros((L, ep))
    fill = np.zeros((L, ep), dtype=np.int64)
    holds = np.zeros((L, E, ep), dtype=bool)
    item_rank = np.zeros((L, P), dtype=np.int64)
    _, shared = hedge_kernel(E, groups if hedge > 0 else 1)  # members are the group's ids in order: by_group below
    if shared.size:
        # affinity[l, r, f]: load on rank r from experts sharing blocks with f, times blocks shared
        affinity = np.zeros((L, ep, E))
        by_group = affinity.reshape(L, ep, groups, E // groups)
    node_of_rank = geometry.node_of_rank()
    multi_node = geometry.num_nodes > 1
    if multi_node:
        node_has = np.zeros((L, E, geometry.num_nodes), dtype=bool)
        penalty = weights.sum(axis=1, keepdims=True) * (1.0 if spread_nodes else 1e-6 / ep)
    for k in range(P):
        e, x = experts[:, k], loads[:, k]
        ok = (fill < S) & ~holds[rows, e]
        cost = rank_load
        if shared.size:
            cost = cost + hedge * affinity[rows, :, e]
        if multi_node:
            cost = cost + penalty * node_has[rows, e][:, node_of_rank]
        r = np.argmin(np.where(ok, cost, np.inf), axis=1)
        for layer in np.flatnonzero(~ok[rows, r]):
            r[layer] = _repair_dead_end(layer, e[layer], x[layer], item_rank, experts, loads, k, rank_load, fill, holds, S)
        rank_load[rows, r] += x
        fill[rows, r] += 1
        holds[rows, e, r] = True
        item_rank[:, k] = r
        if shared.size:  # (a rare dead-end repair moves one placed replica without updating this)
            by_group[rows, r, e // (E // groups)] += x[:, None] * shared[e]
        if multi_node:
            node_has[rows, e, node_of_rank[r]] = True
    order = np.argsort(item_rank, axis=1, kind="stable")
    return np.take_along_axis(experts, order, axis=1)
