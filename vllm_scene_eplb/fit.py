"""The offline fitter: replica counts, placement, bounded swap refinement, validation.

Every step is vectorised across layers (one numpy op handles all L layers), so a 58-layer model
fits in tens of milliseconds. All choices are deterministic: the same counts and options give the
same layout and fingerprint.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from typing import NamedTuple, Sequence

import numpy as np

from . import __version__
from .counts import Counts
from .scenes import check_scenes, mix_passes, normalise_weights, normalised_totals
from .dispatch import DISPATCH_ALGORITHMS, logical_to_physical, static_table
from .errors import SceneEplbError
from .fileio import canonical_json, sha256_hex
from .fitness import EXPECTED_KEY, expected_balancedness
from .layout import Geometry, Layout, linear_map, replica_counts, same_rank_duplicates
from .score import balance, dispatch_score, ideal_score, per_pass_score, static_score, static_slot_loads

FITTER_VERSION = f"{__version__}/fit-3"
# How a fit on several scenes weighs them: ``mean`` balances the weighted mix (each scene normalised
# per layer), ``worst`` also refits the layers whose worst scene scores highest toward that scene.
OBJECTIVES = ("mean", "worst")
# ``worst``: the share of layers (by worst-scene score) that get the second, reweighted fit.
WORST_REFIT_SHARE = 0.25
# Candidate risk weights for robust mode: weights = mean + kappa * std over the train passes.
ROBUST_KAPPAS = (0.0, 0.5, 1.0, 2.0)


@dataclass(frozen=True)
class FitOptions:
    """What the fitter optimises for: the geometry, the dispatch it will run under, robust mode."""

    geometry: Geometry
    dispatch: str = "static"
    robust: bool = False
    expert_groups: int = 1  # the model's routing groups (DeepSeek-V3/R1: n_group = 8); 1 = none
    group_hedge: float = 0.5  # placement weight of a rank's load from the expert's own blocks
    max_rounds: int = 256
    tolerance: float = 1e-4
    objective: str = "mean"  # several scenes: balance their weighted mix, or each layer's worst scene

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise SceneEplbError(f"objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        if self.expert_groups < 1 or self.geometry.num_experts % self.expert_groups:
            raise SceneEplbError(f"expert_groups must be >= 1 and divide {self.geometry.num_experts} experts, got {self.expert_groups}")
        if not (np.isfinite(self.group_hedge) and self.group_hedge >= 0):
            raise SceneEplbError(f"group_hedge must be >= 0, got {self.group_hedge}")
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
    replicas = np.ones((L, E), dtype=np.int64)
    rows = np.arange(L)
    for _ in range(num_redundant):
        ratio = np.where(replicas < cap, weights / replicas, -1.0)
        replicas[rows, np.argmax(ratio, axis=1)] += 1
    return replicas


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


def place(replicas: np.ndarray, weights: np.ndarray, geometry: Geometry, spread_nodes: bool, groups: int = 1, hedge: float = 0.0) -> np.ndarray:
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


def _best_swaps(expert, value, holds, load, lay, m, partners):
    """For problems n = (layer ``lay``, rank ``m`` to relieve, ``partners`` [N, K]), the swap of a
    replica on m with one on a partner that makes the larger of the two new loads smallest.

    Returns (found bool [N], slot on m [N], partner rank [N], slot on it [N]). A swap must lower m
    without raising the partner to m's old load, so the sum of squared rank loads falls strictly;
    it must not create a same-rank duplicate.
    """
    N, K = partners.shape
    S = expert.shape[2]
    top = load[lay, m]
    a_val, a_exp = value[lay, m], expert[lay, m]  # [N, S]
    p_val = value[lay[:, None], partners]  # [N, K, S]
    p_exp = expert[lay[:, None], partners]
    delta = a_val[:, :, None, None] - p_val[:, None, :, :]  # [N, S, K, S]
    p_load = load[lay[:, None], partners]  # [N, K]
    pair_max = np.maximum(top[:, None, None, None] - delta, p_load[:, None, :, None] + delta)
    valid = (delta > 0) & (pair_max < top[:, None, None, None] * (1.0 - 1e-12))
    valid &= (partners != m[:, None])[:, None, :, None]
    b_on_m = np.take_along_axis(holds[lay, m], p_exp.reshape(N, -1), axis=1).reshape(N, 1, K, S)
    a_on_p = holds[lay[:, None, None], partners[:, None, :], a_exp[:, :, None]][..., None]  # [N, S, K, 1]
    valid &= ~b_on_m & ~a_on_p
    flat = np.where(valid, pair_max, np.inf).reshape(N, -1)
    best = np.argmin(flat, axis=1)
    found = np.isfinite(flat[np.arange(N), best])
    i, k, j = np.unravel_index(best, (S, K, S))
    return found, i, partners[np.arange(N), k], j


def refine(p2l: np.ndarray, slot_load: np.ndarray, geometry: Geometry, max_rounds: int, tolerance: float, pairs: int = 1) -> np.ndarray:
    """Bounded pairwise swaps: each round, in every unfinished layer, swap one replica on the
    busiest rank with one on the 3 lightest ranks so that the larger of the two new loads is
    smallest (all ranks are tried if those cannot help). With ``pairs`` = 2 (and 8+ ranks), the
    second busiest rank likewise swaps with the next 3 lightest in the same round when it is
    above tolerance too: disjoint ranks, so both swaps hold, and rounds roughly halve.

    A layer is done when within ``tolerance`` of perfect balance or when no swap helps its
    busiest rank. ``slot_load`` [L, P] is the load each replica carries with it. Returns the map
    [L, P] and where each slot's replica came from, int [L, P] (to carry per-slot data along).
    """
    L, P = p2l.shape
    E, ep, S = geometry.num_experts, geometry.ep_size, geometry.slots_per_rank
    expert = p2l.reshape(L, ep, S).copy()
    value = slot_load.reshape(L, ep, S).astype(np.float64).copy()
    holds = np.zeros((L, ep, E), dtype=bool)
    holds[np.arange(L)[:, None, None], np.arange(ep)[None, :, None], expert] = True
    origin = np.broadcast_to(np.arange(P).reshape(ep, S), (L, ep, S)).copy()
    load = value.sum(axis=2)
    limit = load.mean(axis=1) * (1.0 + tolerance)
    active = np.flatnonzero(load.max(axis=1) > limit)
    K = min(3, ep - 1) if ep > 1 else 0
    pairs = pairs if ep >= pairs * (K + 1) else 1
    for _ in range(max_rounds):
        if active.size == 0 or K == 0:
            break
        order = np.argsort(load[active], axis=1, kind="stable")
        lay = np.concatenate([active] * pairs)
        m = np.concatenate([order[:, -1 - q] for q in range(pairs)])
        partners = np.concatenate([order[:, q * K:(q + 1) * K] for q in range(pairs)])
        keep = load[lay, m] > limit[lay]
        lay, m, partners = lay[keep], m[keep], partners[keep]
        found, i, r, j = _best_swaps(expert, value, holds, load, lay, m, partners)
        stuck = np.flatnonzero(~found[:active.size])  # the busiest rank: try every other rank
        if stuck.size and K < ep - 1:
            all_ranks = np.broadcast_to(np.arange(ep), (stuck.size, ep))
            found[stuck], i[stuck], r[stuck], j[stuck] = _best_swaps(expert, value, holds, load, lay[stuck], m[stuck], all_ranks)
            if pairs > 1:  # the retried swap may touch the second problem's ranks
                found[active.size:] &= ~np.isin(lay[active.size:], lay[stuck])
        alive = found[:active.size]  # a layer whose busiest rank no swap can relieve is done
        lay, m, i, r, j = lay[found], m[found], i[found], r[found], j[found]
        ea, eb = expert[lay, m, i], expert[lay, r, j]
        va, vb = value[lay, m, i], value[lay, r, j]
        expert[lay, m, i], expert[lay, r, j] = eb, ea
        value[lay, m, i], value[lay, r, j] = vb, va
        origin[lay, m, i], origin[lay, r, j] = origin[lay, r, j], origin[lay, m, i]
        load[lay, m] += vb - va
        load[lay, r] += va - vb
        holds[lay, m, ea], holds[lay, r, eb] = False, False
        holds[lay, m, eb], holds[lay, r, ea] = True, True
        active = active[alive]
        active = active[load[active].max(axis=1) > limit[active]]
    return expert.reshape(L, P), origin.reshape(L, P)


def move_sources(p2l: np.ndarray, weights: np.ndarray, sources: np.ndarray, geometry: Geometry, max_rounds: int, tolerance: float) -> np.ndarray:
    """Static-table refinement: each round, in every unfinished layer, hand one source rank of a
    replica on the busiest rank (one serving more than its own rank) to another replica of the
    same expert, where that makes the larger of the two new loads smallest. Each move shifts
    w_e / ep of load. Returns new ``sources`` [L, P] (each expert's total stays ep_size)."""
    L, P = p2l.shape
    ep, S = geometry.ep_size, geometry.slots_per_rank
    rows = np.arange(L)
    sources = sources.copy()
    l2p, _ = logical_to_physical(p2l, geometry.num_experts)
    partners = l2p[rows[:, None], p2l]  # [L, P, W]: every slot's expert's slots
    unit = np.take_along_axis(weights, p2l, axis=1) / ep
    load = (unit * sources).reshape(L, ep, S).sum(axis=2)
    limit = load.mean(axis=1) * (1.0 + tolerance)
    active = np.flatnonzero(load.max(axis=1) > limit)
    for _ in range(max_rounds):
        if active.size == 0:
            break
        n = np.arange(active.size)
        m = np.argmax(load[active], axis=1)
        top = load[active, m]
        mine = m[:, None] * S + np.arange(S)  # [n, S]
        to = partners[active[:, None], mine]  # [n, S, W]
        u = unit[active[:, None], mine][:, :, None]
        new_max = np.maximum(top[:, None, None] - u, load[active[:, None, None], np.maximum(to, 0) // S] + u)
        ok = (to >= 0) & (to // S != m[:, None, None]) & (sources[active[:, None], mine] > 1)[:, :, None]
        ok &= new_max < top[:, None, None] * (1.0 - 1e-12)
        flat = np.where(ok, new_max, np.inf).reshape(active.size, -1)
        best = np.argmin(flat, axis=1)
        found = np.isfinite(flat[n, best])
        i, j = np.unravel_index(best, to.shape[1:])
        lay, src, dst, du = active[found], mine[n, i][found], to[n, i, j][found], unit[active, mine[n, i]][found]
        sources[lay, src] -= 1
        sources[lay, dst] += 1
        load[lay, m[found]] -= du
        load[lay, dst // S] += du
        active = active[found]
        active = active[load[active].max(axis=1) > limit[active]]
    return sources


class Fitted(NamedTuple):
    """A fitted map [L, P] and, for ``static`` dispatch, its fitted source ranks per slot [L, P]."""

    map: np.ndarray
    static_sources: np.ndarray | None


def _fit_weights(weights: np.ndarray, options: FitOptions) -> tuple[Fitted, np.ndarray]:
    """Fit one map to total weights [L, E] (all-zero layers get uniform weights); returns it with
    its per-layer score under the options' dispatch."""
    g = options.geometry
    weights = np.where(weights.sum(axis=1, keepdims=True) > 0, weights, 1.0).astype(np.float64)
    replicas = allocate_replicas(weights, g.num_redundant, g.ep_size)
    p2l = place(replicas, weights, g, spread_nodes=options.dispatch == "static", groups=options.expert_groups, hedge=options.group_hedge)
    if options.dispatch == "static" and g.num_redundant:  # refined with the loads its own table gives
        fitted = _fit_static_table(p2l, weights, options)
        score = static_score(fitted.map, weights, g, fitted.static_sources)
    else:  # (without redundant slots every rank serves every expert's one replica: static is the even split)
        p2l, _ = refine(p2l, np.take_along_axis(weights / replicas, p2l, axis=1), g, options.max_rounds, options.tolerance)
        sources = even_sources(p2l, g) if options.dispatch == "static" else None
        fitted, score = Fitted(p2l, sources), ideal_score(p2l, weights, g)
    return _no_worse_than_linear(fitted, score, weights, options)


def table_sources(p2l: np.ndarray, geometry: Geometry) -> np.ndarray:
    """Source ranks each slot serves under the even-split static table: int [L, P]."""
    L, P = p2l.shape
    table = static_table(p2l, geometry)
    return np.bincount((np.arange(L)[:, None, None] * P + table).ravel(), minlength=L * P).reshape(L, P)


def even_sources(p2l: np.ndarray, geometry: Geometry) -> np.ndarray:
    """Source ranks per slot as evenly as can be: an expert's c replicas serve ep // c each, the
    first ep % c of them (in slot order) one more: int [L, P]."""
    L, P = p2l.shape
    l2p, replicas = logical_to_physical(p2l, geometry.num_experts)
    li, ei, j = np.nonzero(l2p >= 0)
    index = np.zeros((L, P), dtype=np.int64)
    index[li, l2p[li, ei, j]] = j  # each slot's place among its expert's replicas
    c = np.take_along_axis(replicas, p2l, axis=1)
    return geometry.ep_size // c + (index < geometry.ep_size % c)


def _fit_static_table(p2l: np.ndarray, weights: np.ndarray, options: FitOptions, sources: np.ndarray | None = None,
                      rounds: int = 4) -> Fitted:
    """Fit the static table with the map: start from ``sources`` (default even counts), then alternate moving
    source ranks between an expert's replicas (``move_sources``) and swapping replicas with the
    loads their sources give them (``refine``), keeping per layer whatever lowers the peak.
    Why: each source rank sends w_e / ep, so an even split of c replicas is off by up to one such
    step; fitted per replica, those steps balance rank loads (real DeepSeek-V3: worst layer 1.026
    -> 1.001 at EP16)."""
    g, steps, tol = options.geometry, options.max_rounds, options.tolerance
    sources = move_sources(p2l, weights, even_sources(p2l, g) if sources is None else sources, g, steps, tol)
    score = static_score(p2l, weights, g, sources)
    for _ in range(rounds):
        moved, origin = refine(p2l, static_slot_loads(p2l, weights, g, sources), g, steps, tol, pairs=2)
        moved_sources = move_sources(moved, weights, np.take_along_axis(sources, origin, axis=1), g, steps, tol)
        moved_score = static_score(moved, weights, g, moved_sources)
        better = moved_score < score * (1.0 - 1e-9)
        if not better.any():
            break
        p2l = np.where(better[:, None], moved, p2l)
        sources = np.where(better[:, None], moved_sources, sources)
        score = np.where(better, moved_score, score)
    return Fitted(p2l, sources)


def _no_worse_than_linear(fitted: Fitted, score: np.ndarray, weights: np.ndarray, options: FitOptions) -> tuple[Fitted, np.ndarray]:
    """Keep the engines' default (linear) layout in any layer where it scores better than the fit
    (whose per-layer ``score`` is given), e.g. tiny geometries where replicating a cold expert
    beats replicating a hot one; the linear layout must be valid."""
    g = options.geometry
    p2l = fitted.map
    linear = linear_map(g, len(p2l))
    if same_rank_duplicates(linear, g):
        return fitted, score
    slot_loads = weights @ _linear_slot_shares(g, options.dispatch)
    theirs = balance(slot_loads.reshape(len(p2l), g.ep_size, -1).sum(axis=2))
    use = theirs < score - 1e-12
    if not use.any():
        return fitted, score
    sources = None if fitted.static_sources is None else np.where(use[:, None], table_sources(linear, g), fitted.static_sources)
    return Fitted(np.where(use[:, None], linear, p2l), sources), np.where(use, theirs, score)


@functools.lru_cache(maxsize=16)
def _linear_slot_shares(g: Geometry, dispatch: str) -> np.ndarray:
    """Share of each expert's load that each slot of the linear layout takes: float [E, P]. The
    linear layout is the same in every layer, so its dispatch table is computed once."""
    E = g.num_experts
    linear = linear_map(g, E)
    if dispatch == "static":
        return static_slot_loads(linear, np.eye(E), g)
    return np.eye(E)[:, linear[0]] / replica_counts(linear[:1], E)[0][linear[0]]


def fit_map(train: np.ndarray, options: FitOptions) -> Fitted:
    """Fit a map [L, P] (and static table) to train counts [T, L, E]; robust mode picks, per layer,
    the risk weight (mean + kappa * std over passes) whose map has the lowest expected per-pass
    peak on train."""
    train = np.asarray(train, dtype=np.float64)
    total = train.sum(axis=0)
    if not options.robust or train.shape[0] < 2:
        return _fit_weights(total, options)[0]
    T = train.shape[0]
    std = train.std(axis=0) * T
    best, best_score = None, None
    for kappa in ROBUST_KAPPAS:
        fitted, _ = _fit_weights(total + kappa * std, options)
        s = per_pass_score(fitted.map, train, options.geometry)
        best, best_score = (fitted, s) if best is None else pick_per_layer(best, best_score, fitted, s)
    return best


def pick_per_layer(a: Fitted, a_score: np.ndarray, b: Fitted, b_score: np.ndarray) -> tuple[Fitted, np.ndarray]:
    """Per layer, the fit with the lower score (``a`` on ties)."""
    better = b_score < a_score - 1e-12
    sources = None if a.static_sources is None else np.where(better[:, None], b.static_sources, a.static_sources)
    return Fitted(np.where(better[:, None], b.map, a.map), sources), np.where(better, b_score, a_score)


def fit_scenes(trains: Sequence[np.ndarray], weights: np.ndarray, options: FitOptions) -> Fitted:
    """Fit one map to several scenes' train passes (each [T_s, L, E]) with scene ``weights`` [K]
    summing to 1. Each scene is normalised per layer first, so a long recording does not drown a
    short one; ``options.objective`` says what is balanced (``OBJECTIVES``)."""
    fitted = fit_map(mix_passes(trains, weights), options)
    if options.objective == "mean" or len(trains) < 2:
        return fitted
    return _refit_worst_scenes(fitted, normalised_totals(trains), weights, options)


def _refit_worst_scenes(fitted: Fitted, scenes: np.ndarray, weights: np.ndarray, options: FitOptions) -> Fitted:
    """The ``worst`` objective: in the layers whose worst scene scores highest (``WORST_REFIT_SHARE``
    of them), refit to a mix that weighs each scene by how far it is from balance, and keep per
    layer whichever fit has the better worst scene. ``scenes`` [K, L, E] are normalised totals.
    Why only those layers: they hold the worst-scene peaks, and a second fit of every layer would
    double the fit time."""
    g, dispatch = options.geometry, options.dispatch

    def worst_scene(f: Fitted, layers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        per_scene = np.stack([dispatch_score(f.map, s[layers], g, dispatch, f.static_sources) for s in scenes])
        return per_scene, per_scene.max(axis=0)

    all_layers = np.arange(scenes.shape[1])
    per_scene, worst = worst_scene(fitted, all_layers)
    chosen = np.flatnonzero((worst >= np.quantile(worst, 1.0 - WORST_REFIT_SHARE)) & (worst > 1.0 + options.tolerance))
    if chosen.size == 0:
        return fitted
    pull = weights[:, None] * (per_scene[:, chosen] - 1.0 + 1e-3)  # [K, n]: the further from balance, the heavier
    mix = (pull[:, :, None] * scenes[:, chosen]).sum(axis=0) / pull.sum(axis=0)[:, None]
    subset = Fitted(fitted.map[chosen], None if fitted.static_sources is None else fitted.static_sources[chosen])
    refit = _warm_refit(subset, mix, options)
    best, _ = pick_per_layer(subset, worst[chosen], refit, worst_scene(refit, chosen)[1])
    p2l = fitted.map.copy()
    p2l[chosen] = best.map
    sources = None
    if fitted.static_sources is not None:
        sources = fitted.static_sources.copy()
        sources[chosen] = best.static_sources
    return Fitted(p2l, sources)


def _warm_refit(fitted: Fitted, weights: np.ndarray, options: FitOptions) -> Fitted:
    """Refit a fit [n, P] to new weights [n, E] from where it is (same replica counts): swaps, and
    for ``static`` the table with them. Cheaper than a fit from scratch, which places every replica."""
    g = options.geometry
    if options.dispatch == "static":
        return _fit_static_table(fitted.map, weights, options, fitted.static_sources)
    replicas = replica_counts(fitted.map, g.num_experts)
    moved, _ = refine(fitted.map, np.take_along_axis(weights / replicas, fitted.map, axis=1), g, options.max_rounds, options.tolerance)
    return Fitted(moved, None)


def fingerprint(counts_digest: str, options: FitOptions) -> str:
    """Hash of fitter version, input counts and options: equal fingerprints mean equal layouts."""
    return sha256_hex(canonical_json({"fitter": FITTER_VERSION, "counts": counts_digest, "options": options.to_dict()}))[:16]


def fit(counts: Counts | Sequence[Counts], options: FitOptions, scene_weights: Sequence[float] | None = None) -> Layout:
    """Fit a layout to the train half of ``counts`` (all written ring entries if fewer than two),
    or to several scenes' train halves with ``scene_weights`` (default equal; see ``fit_scenes``)."""
    g = options.geometry
    scenes = [counts] if isinstance(counts, Counts) else list(counts)
    check_scenes(scenes, g.num_experts)
    weights = normalise_weights(scene_weights, len(scenes))
    fitted = fit_scenes([c.split()[0] for c in scenes], weights, options)
    first = scenes[0]
    moe = first.meta.get("moe_layers")
    moe_layers = tuple(moe) if moe is not None else tuple(int(i) for i in np.flatnonzero(sum(c.total() for c in scenes).any(axis=1)))
    digests = [c.digest() for c in scenes]
    roles = {c.meta.get("role") for c in scenes}
    layout = Layout(
        fitted.map,
        g,
        static_sources=fitted.static_sources,
        moe_layers=moe_layers,
        meta={
            "fingerprint": fingerprint(digests[0] if len(scenes) == 1 else sha256_hex(canonical_json([digests, weights.tolist()])), options),
            "fitter": FITTER_VERSION,
            "source_counts_sha256": digests,
            "scene_weights": weights.tolist(),
            "objective": options.objective,
            "dispatch": options.dispatch,
            "robust": options.robust,
            "expert_groups": options.expert_groups,
            "model": first.meta.get("model"),
            "role": roles.pop() if len(roles) == 1 else "mixed",
        },
    )
    mix = (weights[:, None, None] * normalised_totals([c.data for c in scenes])).sum(axis=0)
    layout.meta[EXPECTED_KEY] = expected_balancedness(layout, mix, options.dispatch)
    return layout
