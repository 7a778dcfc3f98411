"""Replica dispatch: which physical slot serves a token routed to logical expert e.

Two algorithms (`ep_dispatch_algorithm`), both deterministic so every rank computes the same choice:
- ``static``: a fixed table per source rank: a replica on the same rank if there is one, else one on
  the same node, else any. How many source ranks each replica serves is the layout's fitted
  ``static_sources`` when it has them (the fitter sets them so rank loads balance), else as even as
  can be: no replica serves more than ceil(ep / c) source ranks.
- ``dynamic``: per token, replica ``row mod c`` of the expert's c replicas (an even split).
"""

from __future__ import annotations

import numpy as np

from .layout import Geometry

DISPATCH_ALGORITHMS = ("static", "dynamic")


def logical_to_physical(p2l: np.ndarray, num_experts: int) -> tuple[np.ndarray, np.ndarray]:
    """Replica slots of every expert in ascending slot order.

    Returns (l2p int [L, E, max_replicas] padded with -1, replicas per expert int [L, E]).
    """
    L, P = p2l.shape
    order = np.argsort(p2l, axis=1, kind="stable")  # slots grouped by expert, ascending within
    sorted_ids = np.take_along_axis(p2l, order, axis=1)
    replicas = np.bincount((np.arange(L)[:, None] * num_experts + p2l).ravel(), minlength=L * num_experts).reshape(L, num_experts)
    start = np.cumsum(replicas, axis=1) - replicas
    width = int(replicas.max())
    k = np.arange(P)[None, :] - np.take_along_axis(start, sorted_ids, axis=1)
    l2p = np.full((L, num_experts, width), -1, dtype=np.int64)
    l2p[np.repeat(np.arange(L), P), sorted_ids.ravel(), k.ravel()] = order.ravel()
    return l2p, replicas


def static_table(p2l: np.ndarray, geometry: Geometry, sources: np.ndarray | None = None) -> np.ndarray:
    """Static dispatch table: physical slot chosen by each source rank for each expert, int [L, ep, E].

    A source rank uses its own replica, else its node's replicas, else any replica with spare
    capacity. Capacity: ``sources`` [L, P] (source ranks per slot, a fitted layout's
    ``static_sources``), else ceil(ep / c) per replica of an expert with c replicas (dealt
    round-robin within a node), so no replica takes much more than an even share.
    """
    l2p, replicas, li, ei, chosen = replicated_static_choices(p2l, geometry, sources)
    choice = np.repeat(l2p[:, :, :1], geometry.ep_size, axis=2)  # an expert with one replica: every rank uses it
    choice[li, ei] = chosen
    return np.ascontiguousarray(choice.transpose(0, 2, 1))


def replicated_static_choices(p2l: np.ndarray, geometry: Geometry, sources: np.ndarray | None = None):
    """The static table's rows for replicated experts only (the rest is one slot for all ranks).

    Returns (l2p [L, E, W], replicas [L, E], layer [n], expert [n], slot chosen per source rank [n, ep])
    for the n (layer, expert) pairs with more than one replica.
    """
    l2p, replicas = logical_to_physical(p2l, geometry.num_experts)
    li, ei = np.nonzero(replicas > 1)
    if not li.size:
        return l2p, replicas, li, ei, np.zeros((0, geometry.ep_size), dtype=np.int64)
    reps = l2p[li, ei]
    if sources is None:
        return l2p, replicas, li, ei, _replicated_choices(reps, replicas[li, ei], geometry)
    capacity = np.where(reps >= 0, np.take_along_axis(sources[li], np.maximum(reps, 0), axis=1), 0)
    return l2p, replicas, li, ei, _choices_from_sources(reps, capacity, geometry)


def _choices_from_sources(reps: np.ndarray, capacity: np.ndarray, geometry: Geometry) -> np.ndarray:
    """The static choice of every source rank for n replicated experts whose replicas serve
    ``capacity`` [n, W] source ranks each (summing to ep): reps [n, W] -> slots [n, ep]. A rank
    holding a replica uses it; the others fill spare capacity on their node, then anywhere, in
    rank order and slot order."""
    n, W = reps.shape
    S, rpn = geometry.slots_per_rank, geometry.ranks_per_node
    valid = reps >= 0
    rows = np.arange(n)[:, None]
    choice = np.full((n, geometry.ep_size), -1, dtype=np.int64)
    choice[np.broadcast_to(rows, reps.shape)[valid], reps[valid] // S] = reps[valid]
    spare = np.where(valid, capacity - 1, 0)
    node_of_rank = geometry.node_of_rank()
    replica_node = np.where(valid, reps // (S * rpn), -1)
    passes = (
        [(node_of_rank == node, replica_node == node) for node in range(geometry.num_nodes)] if geometry.num_nodes > 1 else []
    )
    for rank_mask, replica_mask in passes + [(np.ones(geometry.ep_size, dtype=bool), valid)]:
        avail = np.where(replica_mask, spare, 0)
        need = (choice < 0) & rank_mask
        j = np.cumsum(need, axis=1) - 1  # each needing rank's place in the queue
        idx = (np.cumsum(avail, axis=1)[:, None, :] <= j[:, :, None]).sum(axis=2)  # the replica with its place
        take = need & (idx < W)
        idx = np.minimum(idx, W - 1)
        choice[take] = np.take_along_axis(reps, idx, axis=1)[take]
        spare -= np.bincount((rows * W + idx)[take], minlength=n * W).reshape(n, W)
    return choice


def _replicated_choices(reps: np.ndarray, replicas: np.ndarray, geometry: Geometry) -> np.ndarray:
    """The static choice of every source rank for n replicated experts: reps [n, W] (slots in
    ascending order, -1 padded), replicas [n] -> slots [n, ep]."""
    n, W = reps.shape
    ep, S, nodes, rpn = geometry.ep_size, geometry.slots_per_rank, geometry.num_nodes, geometry.ranks_per_node
    rows = np.arange(n)
    valid = reps >= 0
    cap = -(-ep // replicas)  # [n]
    local = np.full((n, ep), -1, dtype=np.int64)  # local[i, r]: the slot of the expert on rank r, or -1
    for k in range(W - 1, -1, -1):  # reverse, so a same-rank duplicate leaves the first copy in place
        ok = valid[:, k]
        local[rows[ok], reps[ok, k] // S] = reps[ok, k]
    # Same node: the j-th rank of a node without a local copy takes node replica j mod m, while
    # that replica is under its cap.
    node_of_replica = np.where(valid, reps // (S * rpn), nodes)
    node_count = (node_of_replica[..., None] == np.arange(nodes)).sum(axis=1)  # [n, nodes]
    node_start = np.cumsum(node_count, axis=1) - node_count
    node_of_rank = geometry.node_of_rank()
    rank_node_count = node_count[:, node_of_rank]  # [n, ep]: replicas on each rank's node
    in_node = np.maximum(rank_node_count, 1)
    needs = (local < 0) & (rank_node_count > 0)
    j = np.cumsum(needs.reshape(n, nodes, rpn), axis=2).reshape(n, ep) - 1
    take = needs & (j // in_node <= cap[:, None] - 2)
    idx = np.where(take, node_start[:, node_of_rank] + j % in_node, 0)
    choice = np.where(take, np.take_along_axis(reps, idx, axis=1), local)
    # Everyone else fills the replicas' spare capacity in slot order.
    own = np.take_along_axis(local, np.where(valid, reps // S, 0), axis=1) == reps
    used = own + np.bincount((rows[:, None] * W + idx)[take], minlength=n * W).reshape(n, W)
    spare = np.cumsum(np.where(valid, cap[:, None] - used, 0), axis=1)
    pool_i, pool_r = np.nonzero(choice < 0)
    jp = (np.cumsum(choice < 0, axis=1) - 1)[pool_i, pool_r]
    rep = (spare[pool_i] <= jp[:, None]).sum(axis=1)
    choice[pool_i, pool_r] = reps[pool_i, np.minimum(rep, W - 1)]
    return choice


def dynamic_tables(p2l: np.ndarray, num_experts: int) -> tuple[np.ndarray, np.ndarray]:
    """Tables for dynamic dispatch: token row i of expert e goes to ``l2p[e, i % replicas[e]]``."""
    return logical_to_physical(p2l, num_experts)
