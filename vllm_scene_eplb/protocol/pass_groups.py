"""A timing window's pass-size groups: the passes of a few sizes kept apart, so that ``advise`` fits the
cost per assignment and the cost per active slot across passes, not only across ranks.

Across the ranks of one window a rank's active slots mostly follow its assignments (a hot rank has
both more assignments and more slots with one), so the two costs cannot be told apart there. Across
pass sizes they move apart: a pass of a few tokens has about one assignment per active slot, a large
one reads every slot and gives each many. Each rank keeps, per group of passes by the tokens the
engine scheduled for them (``PASS_GROUP_TOKENS``), the sums over its real passes of its MoE seconds,
its assignments and its active slots per MoE layer (``RankPassGroups``, in a rank's live answer);
the window carries each group's means per pass (``PassGroup``), checked against the window itself
(``check_groups``). Stdlib only, like the rest of the protocol.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

from .fields import _Fields, _floats, _is_int, _non_negative
from .status import _Answer

# The groups' bounds in tokens scheduled per pass: [0, 8), [8, 64), [64, 512), [512, inf). Decode passes
# of a few sequences fall in the first, prefill chunks in the last; where a server's passes are all of
# one size, the window has one group and the fit is across ranks only.
PASS_GROUP_TOKENS = (8, 64, 512)
GROUPS = len(PASS_GROUP_TOKENS) + 1
# How far the groups' passes-weighted means may stray from the window's own (relative, and absolute per
# pass: the wire rounds means to a few decimals).
GROUP_TOLERANCE, GROUP_ROUNDING = 0.02, 0.02


def pass_group(tokens: int) -> int:
    """The group of a pass of ``tokens`` scheduled tokens (0 .. GROUPS - 1)."""
    return bisect_right(PASS_GROUP_TOKENS, tokens)


def group_tokens(group: int) -> tuple[int, int | None]:
    """[low, high) tokens per pass of ``group`` (high None: no upper bound)."""
    bounds = (0, *PASS_GROUP_TOKENS, None)
    return bounds[group], bounds[group + 1]  # type: ignore[return-value]


@dataclass(frozen=True)
class RankPassGroups(_Answer):
    """One rank's sums per group (``GROUPS`` rows) over its real passes: ``passes`` [G], and [G][L]
    its MoE ``seconds``, its ``assignments`` (the rows its local slots computed) and its ``active``
    slots (those with at least one real row, counted once a pass), per MoE layer."""

    passes: tuple[int, ...]
    seconds: tuple[tuple[float, ...], ...]
    assignments: tuple[tuple[int, ...], ...]
    active: tuple[tuple[int, ...], ...]

    @classmethod
    def from_wire(cls, f: _Fields, layers: int) -> RankPassGroups:
        """Read, ``GROUPS`` rows of ``layers`` values each, the active slots never above the assignments."""
        groups = cls(
            f.integers("passes", length=GROUPS),
            f.matrix("seconds", _non_negative, "a finite non-negative number", GROUPS) or (),
            f.count_matrix("assignments", GROUPS) or (),
            f.count_matrix("active", GROUPS) or (),
        )
        for key in ("seconds", "assignments", "active"):
            if len(getattr(groups, key)[0]) != layers:
                f.fail(f"{key} has {len(getattr(groups, key)[0])} values a group, for {layers} MoE layers")
        if any(k > n for kr, nr in zip(groups.active, groups.assignments) for k, n in zip(kr, nr)):
            f.fail("active is above assignments: a slot is active when it computes at least one row")
        return groups


def _tokens(v: Any) -> bool:
    """[low, high) of a group: integers, high above low or null (no upper bound)."""
    return isinstance(v, list) and len(v) == 2 and _is_int(v[0]) and (v[1] is None or (_is_int(v[1]) and v[1] > v[0]))


@dataclass(frozen=True)
class PassGroup(_Answer):
    """One pass-size group of a timing window: its ``tokens`` [low, high) per pass (high None: no
    bound), the ``passes`` it holds (the fewest any rank counted), and per pass each rank's mean MoE
    ms, assignments and active slots, each [ranks][layers]."""

    tokens: tuple[int, int | None]
    passes: int
    rank_ms: tuple[tuple[float, ...], ...]
    rank_assignments: tuple[tuple[float, ...], ...]
    rank_active_slots: tuple[tuple[float, ...], ...]

    @classmethod
    def from_wire(cls, f: _Fields) -> PassGroup:
        tokens = f.get("tokens", _tokens, "[low, high) tokens per pass: two integers, high above low or null")
        matrices = (
            _floats(f.matrix(key, _non_negative, "a finite non-negative number") or ())
            for key in ("rank_ms", "rank_assignments", "rank_active_slots")
        )
        return cls((tokens[0], tokens[1]), f.integer("passes", 1), *matrices)


def read_groups(f: _Fields) -> tuple[PassGroup, ...]:
    """A window's optional ``pass_groups`` (a list of group objects; absent or null: none)."""
    value = f.get("pass_groups", lambda v: isinstance(v, list), "a list of pass-size groups", nullable=True, default=None)
    groups = []
    for i, doc in enumerate(value or ()):
        groups.append(PassGroup.from_wire(_Fields(doc, f"{f.what}'s pass_groups[{i}]", f.source, f.prefix)))
    return tuple(groups)


def _weighted(groups: tuple[PassGroup, ...], key: str, r: int, i: int) -> float:
    """The passes-weighted mean over ``groups`` of ``key``'s [r][i]."""
    return sum(g.passes * getattr(g, key)[r][i] for g in groups) / sum(g.passes for g in groups)


def check_groups(
    f: _Fields,
    groups: tuple[PassGroup, ...],
    assignments: tuple[tuple[float, ...], ...],
    active: tuple[tuple[float, ...], ...] | None,
) -> None:
    """The groups as a whole against their window (``assignments`` and ``active`` its [ranks][layers]):
    each of the window's shape, its active slots at most its assignments, their token ranges in order
    and apart; and together the window's passes: their passes-weighted means are the window's
    assignments and active slots, up to one factor common to every rank and layer (at least 1: the
    window's passes may hold dummy passes, which compute none of their own rows)."""
    if not groups:
        return
    if active is None:
        f.fail("has pass_groups but no rank_active_slots: the groups come from the same capture as the window's active slots")
    shape = (len(assignments), len(assignments[0]))
    for j, g in enumerate(groups):
        for key in ("rank_ms", "rank_assignments", "rank_active_slots"):
            m = getattr(g, key)
            if (len(m), len(m[0])) != shape:
                f.fail(
                    f"pass_groups[{j}].{key} is [{len(m)}][{len(m[0])}], rank_ms [{shape[0]}][{shape[1]}]: one value per rank and MoE layer"
                )
        if any(k > n * (1 + 1e-9) for kr, nr in zip(g.rank_active_slots, g.rank_assignments) for k, n in zip(kr, nr)):
            f.fail(
                f"pass_groups[{j}] has more active slots than assignments on a rank: a slot is active when it computes at least one"
            )
        before = groups[j - 1].tokens[1] if j else 0
        if before is None or before > g.tokens[0]:
            f.fail(
                f"pass_groups[{j}]'s tokens {list(g.tokens)} overlap or precede pass_groups[{j - 1}]'s {list(groups[j - 1].tokens)}"
            )
    total = sum(map(sum, assignments))
    scale = sum(_weighted(groups, "rank_assignments", r, i) for r in range(shape[0]) for i in range(shape[1])) / max(
        total, 1e-300
    )
    if total > 0 and scale < 1 - GROUP_TOLERANCE:
        f.fail(
            f"pass_groups hold {scale:.3f} times the window's assignments per pass: their passes are the window's, "
            "so they hold at least as many per pass (the window's passes may hold dummy passes, the groups' never)"
        )
    for key, window in (("rank_assignments", assignments), ("rank_active_slots", active)):
        for r in range(shape[0]):
            for i in range(shape[1]):
                got, want = _weighted(groups, key, r, i), scale * window[r][i]
                if abs(got - want) > GROUP_TOLERANCE * want + GROUP_ROUNDING:
                    f.fail(
                        f"pass_groups' passes-weighted mean {key}[{r}][{i}] is {got:.4g} per pass, where the window's "
                        f"{window[r][i]:.4g} times the factor common to every rank and layer ({scale:.3f}: the window's "
                        f"passes over the groups') gives {want:.4g}: the groups are not the window's passes"
                    )
