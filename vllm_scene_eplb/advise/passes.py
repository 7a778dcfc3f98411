"""The recording as passes: a dump's ring entries split into the passes they held.

A ring entry holds ``steps_per_entry`` passes (the dump's metadata). The layout's cost is the
*expected slowest rank per pass*, not the slowest rank of the mean load: per-pass noise makes the max
of a pass larger than the max of the mean, and a layout balanced in aggregate gains less per pass
than it shows in aggregate. Entries of one pass are per-pass samples as they are. An entry of k
passes is split into its passes by the stated model: **its assignments are dealt into k passes of
equal size at random without replacement** (multivariate hypergeometric thinning, seeded), which is
exact when the passes' routing is exchangeable within the entry (each pass an independent draw from
the same distribution) and loses what is correlated inside a pass (one prompt's tokens routed alike:
the real per-pass max can then be larger). k for an entry is its assignments over the tokens per
pass of the metadata (``scheduled_tokens`` over the most ``passes_per_rank``, times ``top_k``),
capped by ``steps_per_entry``, so a partly filled last entry is not split into more passes than it
held. Pure numpy.
"""

from __future__ import annotations

import numpy as np

from ..errors import SceneEplbError
from ..layouts.counts import Counts

DEFAULT_SEED = 0


def _meta_int(meta: dict, key: str, default: int | None) -> int | None:
    value = meta.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SceneEplbError(f"the dump's metadata {key} must be a positive integer, got {value!r}")
    return value


def passes_per_entry(counts: Counts, rows: list[int]) -> np.ndarray:
    """How many passes each written entry holds: int [n_written] (see this module's docstring)."""
    meta = counts.meta
    k = _meta_int(meta, "steps_per_entry", 1) or 1
    written = counts.written_entries()
    if k == 1:
        return np.ones(written.size, dtype=np.int64)
    per_rank, tokens, top_k = meta.get("passes_per_rank"), meta.get("scheduled_tokens"), meta.get("top_k")
    passes = max(per_rank) if isinstance(per_rank, list) and per_rank and all(isinstance(p, int) for p in per_rank) else 0
    if not (passes > 0 and isinstance(tokens, int) and tokens > 0 and isinstance(top_k, int) and top_k > 0):
        return np.full(written.size, k, dtype=np.int64)
    per_pass = tokens / passes * top_k  # assignments per layer in one pass
    entry = counts.data[written][:, rows].sum(axis=2).max(axis=1)
    return np.clip(np.rint(entry / per_pass), 1, k).astype(np.int64)


def split_passes(entries: np.ndarray, m: int, rng: np.random.Generator) -> np.ndarray:
    """Entries' counts [n, L, E] dealt into ``m`` passes each of equal size (per layer, the remainder
    to the first passes) at random without replacement: int [n, m, L, E] summing back to ``entries``."""
    pool = np.array(entries, dtype=np.int64)
    n, L, E = pool.shape
    if m == 1:
        return pool[:, None]
    if pool.sum(axis=2).max() >= 10**9:
        raise SceneEplbError("a ring entry holds 10^9 or more assignments in one layer: not a recording of passes")
    out = np.zeros((n, m, L, E), dtype=np.int64)
    total = pool.sum(axis=2)  # [n, L]
    for j in range(m - 1):
        need = total // (m - j) + (total % (m - j) > 0)  # this pass's size, the larger ones first
        rest = total.copy()
        for e in range(E):
            good = pool[:, :, e]
            take = rng.hypergeometric(good, rest - good, need) if need.any() else np.zeros_like(need)
            out[:, j, :, e] = take
            need, rest = need - take, rest - good
        pool -= out[:, j]
        total = pool.sum(axis=2)
    out[:, m - 1] = pool
    return out


def recorded_passes(counts: Counts, rows: list[int], seed: int = DEFAULT_SEED) -> tuple[np.ndarray, np.ndarray]:
    """Every pass of the recording, the MoE rows only: logical counts [n, L_moe, E] and the written
    entry each pass came from [n] (the entries' order, for the halves)."""
    written = counts.written_entries()
    m = passes_per_entry(counts, rows)
    rng = np.random.default_rng(seed)
    parts, origin = [], []
    for k in np.unique(m):
        idx = np.flatnonzero(m == k)
        split = split_passes(counts.data[written[idx]][:, rows], int(k), rng)  # [len(idx), k, L, E]
        parts.append(split.reshape(-1, *split.shape[2:]))
        origin.append(np.repeat(idx, k))
    order = np.argsort(np.concatenate(origin), kind="stable")
    return np.concatenate(parts)[order], np.concatenate(origin)[order]
