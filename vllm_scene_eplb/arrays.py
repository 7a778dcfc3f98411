"""Decoded input (JSON lists, numpy arrays from npz or torch files) into checked int64 arrays.

JSON hides traps numpy does not see: ``true`` becomes 1 in ``np.asarray``, an integer too wide for
int64 makes an object array, a string beside numbers makes every number a string. Counts and
layout maps both come through here, so each trap is caught once, with the first bad position.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import SceneEplbError


def _first(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(mask)[0])


def _leaf_problem(raw: list) -> str | None:
    """What is wrong with the leaves of nested JSON lists (not numbers, booleans), or None."""
    try:
        leaves = np.asarray(raw, dtype=object)
    except ValueError:
        return "is not a rectangular array (rows of different lengths?)"
    kinds = set(map(type, leaves.ravel()))
    if list in kinds:  # numpy makes an object array of the rows when their lengths differ
        return "is not a rectangular array (rows of different lengths?)"
    if bool in kinds:
        return "holds true/false values; expected integers"
    other = kinds - {int, float}
    if other:
        return f"holds {sorted(t.__name__ for t in other)[0]} values; expected integers"
    return None


def integer_array(raw: Any, what: str, path: str | None, low: int, high: int, axes: dict[int, str]) -> np.ndarray:
    """``raw`` as a non-empty int64 array of values in [low, high] whose dimension count is a key of
    ``axes`` (which names its axes, e.g. ``{2: "[layer, slot]"}``). Integral floats are accepted;
    anything else is a SceneEplbError naming ``what``, ``path`` and a bad value's first position."""
    if isinstance(raw, list):
        problem = _leaf_problem(raw)
        if problem:
            raise SceneEplbError(f"{what} {problem}", path)
    try:
        arr = np.asarray(raw)
    except (ValueError, TypeError):
        raise SceneEplbError(f"{what} is not a rectangular array of numbers", path) from None
    if arr.ndim not in axes:
        raise SceneEplbError(f"{what} must be {' or '.join(axes.values())}, got {arr.ndim} dimension(s) {list(arr.shape)}", path)
    where = axes[arr.ndim]
    if 0 in arr.shape:
        raise SceneEplbError(f"{what} is empty: shape {list(arr.shape)}", path)
    if arr.dtype == object:  # integers wider than int64 (JSON's only way to get here)
        wide = np.frompyfunc(lambda v: not low <= v <= high, 1, 1)(arr).astype(bool)
        pos = _first(wide)
        raise SceneEplbError(f"{what} has a value out of range [{low}, {high}] at {where} = {list(pos)}", path)
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise SceneEplbError(f"{what} must hold integers, got dtype {arr.dtype}", path)
    checks = [
        (arr < low, f"a value below {low}" if low else "a negative value"),
        (arr > high, f"a value above {high}, out of range"),
    ]
    if np.issubdtype(arr.dtype, np.floating):
        finite = np.isfinite(arr)
        checks = [
            (~finite, "a non-finite value"),
            (finite & (arr != np.floor(arr)), "a fractional value (expected integers)"),
        ] + checks
    for mask, problem in checks:
        if mask.any():
            pos = _first(mask)
            raise SceneEplbError(f"{what} has {problem} {arr[pos].item()!r} at {where} = {list(pos)}", path)
    return np.ascontiguousarray(arr, dtype=np.int64)
