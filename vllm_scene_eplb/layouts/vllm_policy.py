"""vLLM's default EPLB policy (DeepSeek's EPLB, ``vllm/distributed/eplb/policy/default.py`` in
vLLM 0.32) in numpy: the peer that reports set beside a fitted layout.

The same operations in the same order as vLLM's, so the maps are equal to its own, map for map
(``tests/unit/test_vllm_policy.py`` checks them against vLLM's). vLLM runs the policy on the load
window of its MoE layers, cast to float32, with the model's routing groups (``n_group``), the
nodes and the EP ranks; it serves the map with a per-token hash over an expert's replicas, an even
split (the ideal score). Left out: ``preserve_intragpu_slots``, which only reorders a rank's own
slots to keep experts where they were, so no load moves between ranks. vLLM's map may hold an
expert twice on one rank, which ``Layout`` refuses: the policy gives a bare map.

Shapes: X rows (layers), n items; L MoE layers, E logical experts, P = E + R physical slots.
"""

from __future__ import annotations

import numpy as np

from ..errors import SceneEplbError
from .layout import Geometry


def balanced_packing(weight: np.ndarray, num_packs: int) -> tuple[np.ndarray, np.ndarray]:
    """Pack the n items of each row into ``num_packs`` packs of n / num_packs items each, heaviest
    first into the lightest pack that has room: weight [X, n] -> (pack of each item int [X, n],
    its place in the pack int [X, n])."""
    num_layers, num_items = weight.shape
    per_pack = num_items // num_packs
    if per_pack == 1:
        pack_index = np.tile(np.arange(num_items, dtype=np.int64), (num_layers, 1))
        return pack_index, np.zeros_like(pack_index)
    order = np.argsort(-weight, axis=-1)
    pack_index = np.full((num_layers, num_items), -1, dtype=np.int64)
    rank_in_pack = np.full((num_layers, num_items), -1, dtype=np.int64)
    pack_weights = np.zeros((num_layers, num_packs), dtype=np.float64)
    pack_items = np.zeros((num_layers, num_packs), dtype=np.int64)
    for layer in range(num_layers):
        weights_row, items_row = pack_weights[layer], pack_items[layer]
        for item in order[layer]:
            pack = int(np.argmin(weights_row))
            pack_index[layer, item] = pack
            rank_in_pack[layer, item] = items_row[pack]
            weights_row[pack] += weight[layer, item]
            items_row[pack] += 1
            if items_row[pack] == per_pack:
                weights_row[pack] = np.inf  # full: never the lightest again
    return pack_index, rank_in_pack


def replicate_experts(weight: np.ndarray, num_phy: int) -> tuple[np.ndarray, np.ndarray]:
    """Give each extra slot to the expert with the highest load per replica: weight [X, n] ->
    (expert of each slot int [X, num_phy]: slot i < n holds expert i, replicas per expert int [X, n])."""
    rows, num_log = weight.shape
    phy2log = np.tile(np.arange(num_phy, dtype=np.int64), (rows, 1))
    logcnt = np.ones((rows, num_log), dtype=np.int64)
    every_row = np.arange(rows, dtype=np.int64)
    for slot in range(num_log, num_phy):
        hottest = np.argmax(weight / logcnt, axis=-1)
        phy2log[:, slot] = hottest
        logcnt[every_row, hottest] += 1
    return phy2log, logcnt


def _inverse(perm: np.ndarray) -> np.ndarray:
    """The inverse of every row's permutation: int [X, n] -> int [X, n]."""
    inv = np.empty_like(perm)
    inv[np.arange(perm.shape[0])[:, None], perm] = np.arange(perm.shape[1], dtype=np.int64)
    return inv


def rebalance_hierarchical(weight: np.ndarray, num_physical: int, num_groups: int, num_nodes: int, num_gpus: int) -> np.ndarray:
    """Groups packed onto nodes, each node's experts replicated into its slots, then its slots
    packed onto its GPUs: weight [L, E] -> physical_to_logical_map int [L, P] (P = num_physical).
    One group and one node is vLLM's global policy."""
    num_layers, num_logical = weight.shape
    group_size = num_logical // num_groups
    groups_per_node = num_groups // num_nodes
    per_gpu = num_physical // num_gpus
    group_load = weight.reshape(num_layers, num_groups, group_size).sum(axis=-1)
    group_pack, group_rank = balanced_packing(group_load, num_nodes)
    # each expert's place in its node's order: the node's groups in packing order, ids within a group kept
    log2mlog = (
        ((group_pack * groups_per_node + group_rank)[..., None] * group_size) + np.arange(group_size, dtype=np.int64)
    ).reshape(num_layers, num_logical)
    mlog2log = _inverse(log2mlog)
    node_load = np.take_along_axis(weight, mlog2log, axis=1).reshape(-1, num_logical // num_nodes)
    phy2mlog, mlogcnt = replicate_experts(node_load, num_physical // num_nodes)
    replica_load = np.take_along_axis(node_load / mlogcnt, phy2mlog, axis=1)
    pack, rank = balanced_packing(replica_load, num_gpus // num_nodes)
    pphy2phy = _inverse(pack * per_gpu + rank)
    pphy2mlog = np.take_along_axis(phy2mlog, pphy2phy, axis=1)
    node_start = np.arange(0, num_logical, num_logical // num_nodes, dtype=np.int64)[None, :, None]
    pphy2mlog = (pphy2mlog.reshape(num_layers, num_nodes, -1) + node_start).reshape(num_layers, -1)
    return np.take_along_axis(mlog2log, pphy2mlog, axis=1)


def vllm_policy_map(weights: np.ndarray, geometry: Geometry, expert_groups: int) -> np.ndarray:
    """The map vLLM's policy gives for the load ``weights`` [L, E] (counts or a mix; MoE layers
    only) on ``geometry`` with the model's ``expert_groups``: int64 [L, P]. Hierarchical where the
    groups divide over the nodes, else global, as ``DefaultEplbPolicy.rebalance_experts`` chooses."""
    g = geometry
    if expert_groups < 1 or g.num_experts % expert_groups:
        raise SceneEplbError(f"vLLM's policy needs routing groups that divide {g.num_experts} experts, got {expert_groups}")
    w = np.asarray(weights, dtype=np.float32)  # vLLM casts its load window with .float()
    if expert_groups % g.num_nodes == 0:
        return rebalance_hierarchical(w, g.num_physical, expert_groups, g.num_nodes, g.ep_size)
    return rebalance_hierarchical(w, g.num_physical, 1, 1, g.ep_size)
