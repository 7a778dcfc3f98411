"""Replica dispatch: which physical slot serves a token routed to logical expert e.

Two algorithms (`ep_dispatch_algorithm`), both deterministic so every rank computes the same choice:
- ``static``: a fixed table per source rank: a replica on the same rank if there is one, else one on
  the same node, else any, with no replica serving more than ceil(ep / c) source ranks, so the
  replicas of an expert split its load evenly whatever their placement.
- ``dynamic``: per token, replica ``row mod c`` of the expert's c replicas (an even split).
"""

from __future__ import annotations

import numpy as np

from .layout import Geometry

DISPATCH_ALGORITHMS = ("static", "dynamic")


def logical_to_physical(p2l: np.ndarray, num_experts: int) -> tuple[np.ndarray, np.ndarray]:
    """Replica slots of every expert in ascending slot order.

    Returns (l2p int [L, E, max_replicas] padded with -1, replica count int [L, E]).
    """
    L, P = p2l.shape
    order = np.argsort(p2l, axis=1, kind="stable")  # slots grouped by expert, ascending within
    sorted_ids = np.take_along_axis(p2l, order, axis=1)
    count = np.zeros((L, num_experts), dtype=np.int64)
    np.add.at(count, (np.repeat(np.arange(L), P), p2l.ravel()), 1)
    start = np.cumsum(count, axis=1) - count
    width = int(count.max())
    k = np.arange(P)[None, :] - np.take_along_axis(start, sorted_ids, axis=1)
    l2p = np.full((L, num_experts, width), -1, dtype=np.int64)
    l2p[np.repeat(np.arange(L), P), sorted_ids.ravel(), k.ravel()] = order.ravel()
    return l2p, count


def static_table(p2l: np.ndarray, geometry: Geometry) -> np.ndarray:
    """Static dispatch table: physical slot chosen by each source rank for each expert, int [L, ep, E].

    Each replica of an expert with c replicas serves at most ceil(ep / c) source ranks, so no
    replica takes much more than an even share. Within that cap a source rank uses its own
    replica, else its node's replicas (dealt round-robin in slot order), else the replicas with
    spare capacity in slot order.
    """
    L, P = p2l.shape
    E, ep, S = geometry.num_experts, geometry.ep_size, geometry.slots_per_rank
    nodes, rpn = geometry.num_nodes, geometry.ranks_per_node
    l2p, count = logical_to_physical(p2l, E)  # replicas in slot order, hence in rank and node order
    W = l2p.shape[2]
    valid = l2p >= 0
    cap = -(-ep // count)  # [L, E]
    local = np.full((L, E, ep), -1, dtype=np.int64)  # local[l, e, r]: the slot of e on rank r, or -1
    slots = np.arange(P)
    local[np.repeat(np.arange(L), P), p2l.ravel(), np.tile(slots // S, L)] = np.tile(slots, L)
    # Same node: the j-th rank of a node without a local copy takes node replica j mod n, while
    # that replica is under its cap.
    node_of_replica = np.where(valid, l2p // (S * rpn), nodes)
    node_count = (node_of_replica[..., None] == np.arange(nodes)).sum(axis=2)  # [L, E, nodes]
    node_start = np.cumsum(node_count, axis=2) - node_count
    node_of_rank = geometry.node_of_rank()
    in_node = np.maximum(node_count[..., node_of_rank], 1)  # [L, E, ep]
    needs = (local < 0) & (node_count[..., node_of_rank] > 0)
    j = np.cumsum(needs.reshape(L, E, nodes, rpn), axis=3).reshape(L, E, ep) - 1
    take = needs & (j // in_node <= cap[..., None] - 2)
    idx = np.where(take, node_start[..., node_of_rank] + j % in_node, 0)
    choice = np.where(take, np.take_along_axis(l2p, idx, axis=2), local)
    # Everyone else fills the replicas' spare capacity in slot order.
    row = (np.arange(L)[:, None] * E + np.arange(E)[None, :])[..., None] * W
    # A replica serves its own rank unless it is a same-rank duplicate (then the first copy does).
    own = np.take_along_axis(local, np.where(valid, l2p // S, 0), axis=2) == l2p
    used = own + np.bincount((row + idx)[take], minlength=L * E * W).reshape(L, E, W)
    spare = np.cumsum(np.where(valid, cap[..., None] - used, 0), axis=2)
    pool = choice < 0
    jp = np.cumsum(pool, axis=2) - 1
    lp, ep_, rp = np.nonzero(pool)
    rep = (spare[lp, ep_] <= jp[lp, ep_, rp][:, None]).sum(axis=1)
    choice[lp, ep_, rp] = l2p[lp, ep_, np.minimum(rep, W - 1)]
    return np.ascontiguousarray(choice.transpose(0, 2, 1))


def dynamic_tables(p2l: np.ndarray, num_experts: int) -> tuple[np.ndarray, np.ndarray]:
    """Tables for dynamic dispatch: token row i of expert e goes to ``l2p[e, i % count[e]]``."""
    return logical_to_physical(p2l, num_experts)
