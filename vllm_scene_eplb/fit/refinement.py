"""Stage 3, refinement: bounded pairwise swaps between the most and a less loaded rank.

``refine(p2l [L, P], slot_load [L, P], geometry, max_rounds, tolerance) -> (p2l [L, P], origin [L, P])``:
each round, in every unfinished layer at once, swaps one replica on the busiest rank with one on
the lightest ranks so that the larger of the two new loads is smallest (never making a same-rank
duplicate); ``origin`` says which input slot each output slot's replica came from.
"""

from __future__ import annotations

import numpy as np

from ..layouts.layout import Geometry


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


def refine(
    p2l: np.ndarray, slot_load: np.ndarray, geometry: Geometry, max_rounds: int, tolerance: float, pairs: int = 1
) -> tuple[np.ndarray, np.ndarray]:
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
        partners = np.concatenate([order[:, q * K : (q + 1) * K] for q in range(pairs)])
        keep = load[lay, m] > limit[lay]
        lay, m, partners = lay[keep], m[keep], partners[keep]
        found, i, r, j = _best_swaps(expert, value, holds, load, lay, m, partners)
        stuck = np.flatnonzero(~found[: active.size])  # the busiest rank: try every other rank
        if stuck.size and K < ep - 1:
            all_ranks = np.broadcast_to(np.arange(ep), (stuck.size, ep))
            found[stuck], i[stuck], r[stuck], j[stuck] = _best_swaps(expert, value, holds, load, lay[stuck], m[stuck], all_ranks)
            if pairs > 1:  # the retried swap may touch the second problem's ranks
                found[active.size :] &= ~np.isin(lay[active.size :], lay[stuck])
        alive = found[: active.size]  # a layer whose busiest rank no swap can relieve is done
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
