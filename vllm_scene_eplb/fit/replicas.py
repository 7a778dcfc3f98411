"""Stage 1, replicas: how many slots each expert gets, from its load.

``allocate_replicas(weights [L, E], R, cap) -> int [L, E]``: every expert one slot, then each of the
R redundant slots to the expert with the largest load per replica w_e / c_e (at most ``cap`` replicas:
one per rank); each row sums to E + R.
"""

from __future__ import annotations

import numpy as np


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
