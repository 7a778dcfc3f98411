"""Routing counts (`logical_count`): validation, the train/holdout split and summaries.

Counts are int [T, L, E]: T recorder ring entries, one forward pass each (unordered, unwritten
entries are zero; not physical expert slots), L layers in the model's layer axis (dense layers stay
all-zero), E logical experts. A value is a number of (token, top-k) assignments, already summed over
ranks exactly once. Where the recorder saw them, ``sources`` [S, L, E] splits the same assignments
by the EP rank that routed them (``Counts.sources``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..arrays import integer_array
from ..errors import SceneEplbError
from ..fileio import canonical_json, sha256_hex

# Every count, and the sum of all counts in a file, is at most 2**53: then every sum the tools take
# (over passes, layers, experts, ranks) is exact in int64 and in float64, and cannot overflow.
MAX_COUNT = 2**53
MAX_TOTAL = 2**53
COUNT_AXES = {3: "[T, L, E]", 2: "[L, E]"}


def validate_count_array(raw: Any, path: str | None = None) -> np.ndarray:
    """Check a [T, L, E] or [L, E] array of counts and return it as int64 [T, L, E].

    Rejects ragged or empty input, non-numeric or boolean values, NaN/inf, fractional values,
    negatives and values or totals above what sums can hold exactly, each with a message naming
    the first bad position.
    """
    arr = _capped(integer_array(raw, "logical_count", path, 0, MAX_COUNT, COUNT_AXES), "logical_count", path)
    return arr if arr.ndim == 3 else arr[None]


def _capped(arr: np.ndarray, what: str, path: str | None) -> np.ndarray:
    """``arr`` when its total is at most MAX_TOTAL (summed in float64, which cannot wrap), so every
    int64 sum of it is exact; else the one-line refusal naming ``what``."""
    total = float(arr.sum(dtype=np.float64))
    if total > MAX_TOTAL:
        raise SceneEplbError(
            f"{what} sums to {total:.3g} assignments, above the {MAX_TOTAL:.3g} (2**53) that "
            "sums of counts hold exactly: not a recording",
            path,
        )
    return arr


def counts_digest(data: np.ndarray) -> str:
    """SHA-256 of the counts' shape and little-endian int64 bytes; identifies a counts file's content."""
    arr = np.ascontiguousarray(data, dtype="<i8")
    return sha256_hex(canonical_json(list(arr.shape)) + arr.tobytes())


def validate_physical(raw: Any, logical: np.ndarray, path: str | None = None) -> np.ndarray:
    """Check measured replica traffic ``physical_count`` [T, L, P] (or [L, P]) against the logical
    counts [T, L, E] it came with: the same ring entries and layers, and per entry and layer the
    same number of assignments (every assignment went to exactly one slot)."""
    arr = _capped(integer_array(raw, "physical_count", path, 0, MAX_COUNT, COUNT_AXES), "physical_count", path)
    arr = arr if arr.ndim == 3 else arr[None]
    if arr.shape[:2] != logical.shape[:2]:
        raise SceneEplbError(
            f"physical_count {list(arr.shape)} does not match logical_count {list(logical.shape)} in ring entries and layers",
            path,
        )
    _same_totals(
        "physical_count", arr.sum(axis=2), logical.sum(axis=2), "[T, L]", "every assignment goes to exactly one slot", path
    )
    return arr


def _same_totals(name: str, got: np.ndarray, want: np.ndarray, axes: str, why: str, path: str | None) -> None:
    """Refuse ``name`` where its totals ``got`` differ from the logical counts' ``want`` (same shape),
    naming the first differing position on ``axes``."""
    differ = got != want
    if differ.any():
        pos = tuple(int(i) for i in np.argwhere(differ)[0])
        raise SceneEplbError(
            f"{name} holds {int(got[pos])} assignments at {axes} = {list(pos)}, logical_count {int(want[pos])}: {why}", path
        )


SOURCE_AXES = {3: "[S, L, E]"}


def validate_sources(raw: Any, logical: np.ndarray, path: str | None = None) -> np.ndarray:
    """Check per-source counts ``source_count`` [S, L, E] against the logical counts [T, L, E] they
    came with: the same layers and experts, and summed over the S source ranks the window's totals
    (every assignment was routed by exactly one rank)."""
    arr = integer_array(raw, "source_count", path, 0, MAX_COUNT, SOURCE_AXES)
    if arr.shape[1:] != logical.shape[1:]:
        raise SceneEplbError(
            f"source_count {list(arr.shape)} does not match logical_count {list(logical.shape)} in layers and experts", path
        )
    _same_totals("source_count", arr.sum(axis=0), logical.sum(axis=0), "[L, E]", "every assignment has one source rank", path)
    return arr


@dataclass(frozen=True)
class Counts:
    """Validated routing counts plus free-form metadata (model, role, geometry, layer ids...), and
    where the recorder saw them, the measured replica traffic and the counts by source rank.

    Shapes: T recorder ring entries (each the counts of ``steps_per_entry`` engine steps; unwritten
    entries are all zero), L layers of the model's layer axis (dense layers all zero), E logical
    experts, P physical slots of the layout that ran, S source ranks (the EP ranks). A value is a
    number of (token, top-k) assignments, summed over ranks exactly once.

    - ``data``: int64 [T, L, E] (a [L, E] input is read as T = 1); each value and the total at
      most 2**53, so every sum of them is exact.
    - ``meta``: dict: model, role, geometry, ``moe_layers``, dump figures, ...
    - ``physical``: int64 [T, L, P] or None: the same assignments by the physical slot that computed
      them; the same entries and layers, ``physical.sum(2) == data.sum(2)``.
    - ``sources``: int64 [S, L, E] or None: the window's assignments by the EP rank s that routed
      them itself (its DP rank's tokens, or its even share of the rows of a batch several TP ranks
      see: the static table's source rank s), summed over the entries: ``sources.sum(0) ==
      data.sum(0)``.

    Example: T = 2 entries, one MoE layer, E = 3, top-k 2, one token per entry, on ep_size 2 with
    R = 1 (the map ``[[0, 1, 2, 0]]``); entry 0's token (routed by rank 0) picks experts 0 and 2,
    entry 1's (routed by rank 1) experts 0 and 1, each served by its own rank's replica of 0::

        data     = [[[1, 0, 1]], [[1, 1, 0]]]          # [T, L, E]; total() = [[2, 1, 1]]
        physical = [[[1, 0, 1, 0]], [[0, 1, 0, 1]]]    # [T, L, P]: entry 1's expert 0 ran on slot 3
        sources  = [[[1, 0, 1]], [[1, 1, 0]]]          # [S, L, E]: by source rank, entries summed
    """

    data: np.ndarray
    meta: dict = field(default_factory=dict)
    physical: np.ndarray | None = None
    sources: np.ndarray | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "data", validate_count_array(self.data))
        if self.physical is not None:
            object.__setattr__(self, "physical", validate_physical(self.physical, self.data))
        if self.sources is not None:
            object.__setattr__(self, "sources", validate_sources(self.sources, self.data))

    @property
    def num_entries(self) -> int:
        return int(self.data.shape[0])

    @property
    def num_layers(self) -> int:
        return int(self.data.shape[1])

    @property
    def num_experts(self) -> int:
        return int(self.data.shape[2])

    def total(self) -> np.ndarray:
        """Counts summed over ring entries: int64 [L, E]."""
        return self.data.sum(axis=0)

    def written_entries(self) -> np.ndarray:
        """Indices of ring entries holding any count (unwritten entries are all zero)."""
        return np.flatnonzero(self.data.reshape(self.num_entries, -1).any(axis=1))

    def active_layers(self) -> np.ndarray:
        """Indices of layers with any routing (all-zero layers are dense or were never routed)."""
        return np.flatnonzero(self.total().any(axis=1))

    def digest(self) -> str:
        return counts_digest(self.data)

    def split(self) -> tuple[np.ndarray, np.ndarray | None]:
        """Split written ring entries into train (first half, rounded up) and holdout (second half).

        Returns ([T1, L, E], [T2, L, E] or None when fewer than two entries were written). This is an
        internal check on held-out passes, not a proof of generalisation.
        """
        written = self.written_entries()
        if written.size < 2:
            return self.data[written] if written.size else self.data[:1], None
        half = (written.size + 1) // 2
        return self.data[written[:half]], self.data[written[half:]]
