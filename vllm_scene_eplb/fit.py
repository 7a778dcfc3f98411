"""The offline fitter: replica counts, placement, bounded swap refinement, validation.

Every step is vectorised across layers (one numpy op handles all L layers), so a 58-layer model
fits in tens of milliseconds. All choices are deterministic: the same counts and options give the
same layout and fingerprint.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from . import __version__
from .counts import Counts
from .dispatch import DISPATCH_ALGORITHMS
from .errors import SceneEplbError
from .fileio import canonical_json, sha256_hex
from .layout import Geometry, Layout, linear_map, same_rank_duplicates
from .score import balance, dispatch_score, ideal_score, per_slot_score, static_slot_loads

FITTER_VERSION = f"{__version__}/fit-1"
# Candidate risk weights for robust mode: weights = mean + kappa * std over train slots.
ROBUST_KAPPAS = (0.0, 0.5, 1.0, 2.0)


@dataclass(frozen=True)
class FitOptions:
    """What the fitter optimises for: the geometry, the dispatch it will run under, robust mode."""

    geometry: Geometry
    dispatch: str = "static"
    robust: bool = False
    max_rounds: int = 256
    tolerance: float = 1e-4

    def __post_init__(self) -> None:
        if self.dispatch not in DISPATCH_ALGORITHMS:
            raise SceneEplbError(f"dispatch must be one of {', '.join(DISPATCH_ALGORITHMS)}, got {self.dispatch!r}")
        if self.max_rounds < 0:
            raise SceneEplbError(f"max_rounds must be >= 0, got {self.max_rounds}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["geometry"] = self.geometry.to_dict()
        return d


def allocate_replicas(weights: np.ndarray, num_redundant: int, cap: int) -> np.ndarray:
    """Give each of R extra slots to the expert with the largest w_e / c_e (c_e capped at ``cap``).

    Returns replica counts int [L, E], each row summing to E + R.
    """
    L, E = weights.shape
    count = np.ones((L, E), dtype=np.int64)
    rows = np.arange(L)
    for _ in range(num_redundant):
        ratio = np.where(count < cap, weights / count, -1.0)
        count[rows, np.argmax(ratio, axis=1)] += 1
    return count


def _expand_items(count: np.ndarray, share: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All replicas of every layer as (expert id, load), heaviest first: two [L, P] arrays."""
    L, E = count.shape
    experts = np.repeat(np.tile(np.arange(E), L), count.ravel()).reshape(L, -1)
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


def place(count: np.ndarray, weights: np.ndarray, geometry: Geometry, spread_nodes: bool) -> np.ndarray:
    """Greedy placement: replicas heaviest first onto the least-loaded rank with a free slot that
    does not hold the expert yet. With several nodes, a node without a replica of the expert is
    preferred: always when ``spread_nodes`` (static dispatch serves each node from its own replica,
    so spreading evens the replicas' shares), else only to break near-ties (within 1e-6 of the
    mean rank load), which keeps traffic node-local at no cost in balance.

    Returns physical_to_logical_map int [L, P].
    """
    L, E = count.shape
    ep, S = geometry.ep_size, geometry.slots_per_rank
    share = weights / count
    experts, loads = _expand_items(count, share)
    P = experts.shape[1]
    rows = np.arange(L)
    rank_load = np.zeros((L, ep))
    fill = np.zeros((L, ep), dtype=np.int64)
    holds = np.zeros((L, E, ep), dtype=bool)
    item_rank = np.zeros((L, P), dtype=np.int64)
    node_of_rank = geometry.node_of_rank()
    multi_node = geometry.num_nodes > 1
    if multi_node:
        node_has = np.zeros((L, E, geometry.num_nodes), dtype=bool)
        penalty = weights.sum(axis=1, keepdims=True) * (1.0 if spread_nodes else 1e-6 / ep)
    for k in range(P):
        e, x = experts[:, k], loads[:, k]
        ok = (fill < S) & ~holds[rows, e]
        cost = rank_load
        if multi_node:
            cost = cost + penalty * node_has[rows, e][:, node_of_rank]
        r = np.argmin(np.where(ok, cost, np.inf), axis=1)
        for layer in np.flatnonzero(~ok[rows, r]):
            r[layer] = _repair_dead_end(layer, e[layer], x[layer], item_rank, experts, loads, k, rank_load, fill, holds, S)
        rank_load[rows, r] += x
        fill[rows, r] += 1
        holds[rows, e, r] = True
        item_rank[:, k] = r
        if multi_node:
            node_has[rows, e, node_of_rank[r]] = True
    order = np.argsort(item_rank, axis=1, kind="stable")
    return np.take_along_axis(experts, order, axis=1)


def _best_swaps(expert, value, holds, partners):
    """For each layer, the best swap between its busiest rank and one of ``partners`` [A, K].

    Returns (found bool [A], busiest rank [A], slot on it [A], partner rank [A], slot on that [A]).
    A swap must lower the busiest rank without raising the partner above the old peak, so the
    sum of squared rank loads falls strictly; it must not create a same-rank duplicate.
    """
    A, ep, S = expert.shape
    ar = np.arange(A)
    load = value.sum(axis=2)
    m = np.argmax(load, axis=1)
    peak = load[ar, m]
    a_val, a_exp = value[ar, m], expert[ar, m]  # [A, S]
    p_val = value[ar[:, None], partners]  # [A, K, S]
    p_exp = expert[ar[:, None], partners]
    delta = a_val[:, :, None, None] - p_val[:, None, :, :]  # [A, S, K, S]
    p_load = load[ar[:, None], partners]  # [A, K]
    pair_max = np.maximum(peak[:, None, None, None] - delta, p_load[:, None, :, None] + delta)
    valid = (delta > 0) & (pair_max < peak[:, None, None, None] * (1.0 - 1e-12))
    valid &= (partners != m[:, None])[:, None, :, None]
    K = partners.shape[1]
    b_on_m = np.take_along_axis(holds[ar, m], p_exp.reshape(A, -1), axis=1).reshape(A, 1, K, S)
    a_on_p = holds[ar[:, None, None], partners[:, None, :], a_exp[:, :, None]][..., None]  # [A, S, K, 1]
    valid &= ~b_on_m & ~a_on_p
    flat = np.where(valid, pair_max, np.inf).reshape(A, -1)
    best = np.argmin(flat, axis=1)
    found = np.isfinite(flat[ar, best])
    i, k, j = np.unravel_index(best, (S, K, S))
    return found, m, i, partners[ar, k], j


def refine(p2l: np.ndarray, slot_load: np.ndarray, geometry: Geometry, max_rounds: int, tolerance: float) -> np.ndarray:
    """Bounded pairwise swaps: each round, in every unfinished layer, swap one replica on the
    busiest rank with one on another rank so that the larger of the two new loads is smallest.

    Partners are first the 3 lightest ranks, then all ranks for layers those cannot improve; a
    layer is done when within ``tolerance`` of perfect balance or when no swap helps.
    ``slot_load`` [L, P] is the load each replica carries with it. Returns the new map [L, P].
    """
    L, P = p2l.shape
    E, ep, S = geometry.num_experts, geometry.ep_size, geometry.slots_per_rank
    expert = p2l.reshape(L, ep, S).copy()
    value = slot_load.reshape(L, ep, S).astype(np.float64).copy()
    holds = np.zeros((L, ep, E), dtype=bool)
    holds[np.arange(L)[:, None, None], np.arange(ep)[None, :, None], expert] = True
    load = value.sum(axis=2)
    active = np.flatnonzero(load.max(axis=1) > load.mean(axis=1) * (1.0 + tolerance))
    K = min(3, ep)
    for _ in range(max_rounds):
        if active.size == 0:
            break
        ex, val, hold = expert[active], value[active], holds[active]
        partners = np.argsort(val.sum(axis=2), axis=1, kind="stable")[:, :K]
        found, m, i, r, j = _best_swaps(ex, val, hold, partners)
        stuck = np.flatnonzero(~found)
        if stuck.size and K < ep:
            all_ranks = np.broadcast_to(np.arange(ep), (stuck.size, ep))
            f2, m2, i2, r2, j2 = _best_swaps(ex[stuck], val[stuck], hold[stuck], all_ranks)
            found[stuck], m[stuck], i[stuck], r[stuck], j[stuck] = f2, m2, i2, r2, j2
        lay, m, i, r, j = active[found], m[found], i[found], r[found], j[found]
        ea, eb = expert[lay, m, i], expert[lay, r, j]
        va, vb = value[lay, m, i], value[lay, r, j]
        expert[lay, m, i], expert[lay, r, j] = eb, ea
        value[lay, m, i], value[lay, r, j] = vb, va
        holds[lay, m, ea], holds[lay, r, eb] = False, False
        holds[lay, m, eb], holds[lay, r, ea] = True, True
        load = value[lay].sum(axis=2)
        active = lay[load.max(axis=1) > load.mean(axis=1) * (1.0 + tolerance)]
    return expert.reshape(L, P)


def _fit_weights(weights: np.ndarray, options: FitOptions) -> np.ndarray:
    """Fit one map [L, P] to total weights [L, E] (all-zero layers get uniform weights)."""
    g = options.geometry
    weights = np.where(weights.sum(axis=1, keepdims=True) > 0, weights, 1.0).astype(np.float64)
    count = allocate_replicas(weights, g.num_redundant, g.ep_size)
    p2l = place(count, weights, g, spread_nodes=options.dispatch == "static")
    even = np.take_along_axis(weights / count, p2l, axis=1)
    p2l = refine(p2l, even, g, options.max_rounds, options.tolerance)
    if options.dispatch == "static":
        p2l, score = _refine_for_static(p2l, weights, options)
    else:
        score = ideal_score(p2l, weights, g)
    return _no_worse_than_linear(p2l, score, weights, options)


def _no_worse_than_linear(p2l: np.ndarray, score: np.ndarray, weights: np.ndarray, options: FitOptions) -> np.ndarray:
    """Keep the engines' default (linear) layout in any layer where it scores better than ``p2l``
    (whose per-layer ``score`` is given), e.g. tiny geometries where replicating a cold expert
    beats replicating a hot one; the linear layout must be valid."""
    g = options.geometry
    linear = linear_map(g, len(p2l))
    if same_rank_duplicates(linear, g):
        return p2l
    theirs = dispatch_score(linear, weights, g, options.dispatch)
    return np.where((theirs < score - 1e-12)[:, None], linear, p2l)


def _refine_for_static(p2l: np.ndarray, weights: np.ndarray, options: FitOptions) -> tuple[np.ndarray, np.ndarray]:
    """Refine again with the uneven replica shares the static table really gives. A swap moves a
    replica with its current share, which the table then recomputes, so a layer keeps the new map
    only where its static-dispatch peak really fell. Returns (map, static score per layer)."""
    g = options.geometry
    loads = static_slot_loads(p2l, weights, g)
    candidate = refine(p2l, loads, g, options.max_rounds, options.tolerance)
    before = balance(loads.reshape(len(p2l), g.ep_size, -1).sum(axis=2))
    after = before.copy()
    changed = np.nonzero((candidate != p2l).any(axis=1))[0]  # only those need a new static table
    if changed.size:
        new_loads = static_slot_loads(candidate[changed], weights[changed], g)
        after[changed] = balance(new_loads.reshape(changed.size, g.ep_size, -1).sum(axis=2))
    better = after < before * (1.0 - 1e-9)
    return np.where(better[:, None], candidate, p2l), np.where(better, after, before)


def fit_map(train: np.ndarray, options: FitOptions) -> np.ndarray:
    """Fit a map [L, P] to train counts [T, L, E]; robust mode picks, per layer, the risk weight
    (mean + kappa * std over slots) whose map has the lowest expected per-slot peak on train."""
    train = np.asarray(train, dtype=np.float64)
    total = train.sum(axis=0)
    if not options.robust or train.shape[0] < 2:
        return _fit_weights(total, options)
    T = train.shape[0]
    std = train.std(axis=0) * T
    best_map, best_score = None, None
    for kappa in ROBUST_KAPPAS:
        p2l = _fit_weights(total + kappa * std, options)
        s = per_slot_score(p2l, train, options.geometry)
        if best_map is None:
            best_map, best_score = p2l, s
        else:
            better = s < best_score - 1e-12
            best_map = np.where(better[:, None], p2l, best_map)
            best_score = np.where(better, s, best_score)
    return best_map


def fingerprint(counts_digest: str, options: FitOptions) -> str:
    """Hash of fitter version, input counts and options: equal fingerprints mean equal layouts."""
    return sha256_hex(canonical_json({"fitter": FITTER_VERSION, "counts": counts_digest, "options": options.to_dict()}))[:16]


def fit(counts: Counts, options: FitOptions) -> Layout:
    """Fit a layout to the train half of ``counts`` (all written slots if fewer than two)."""
    g = options.geometry
    if counts.num_experts != g.num_experts:
        raise SceneEplbError(f"counts have {counts.num_experts} experts, geometry says {g.num_experts}")
    train, _ = counts.split()
    p2l = fit_map(train, options)
    moe = counts.meta.get("moe_layers")
    moe_layers = tuple(moe) if moe is not None else tuple(int(i) for i in counts.active_layers())
    return Layout(
        p2l,
        g,
        moe_layers=moe_layers,
        meta={
            "fingerprint": fingerprint(counts.digest(), options),
            "fitter": FITTER_VERSION,
            "source_counts_sha256": counts.digest(),
            "dispatch": options.dispatch,
            "robust": options.robust,
            "model": counts.meta.get("model"),
            "role": counts.meta.get("role"),
        },
    )
