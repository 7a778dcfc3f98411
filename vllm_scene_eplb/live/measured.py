"""What a server measured, beside what its layout models: replica traffic and each rank's MoE time.

The count scores (``score``, ``fitness``) say what a layout should do if every replica gets its
modelled share. These say what happened, per window of live traffic:

- measured score: per MoE layer, max/mean EP rank load of the physical slot counts the ranks
  recorded (slot p lives on rank p // S): the load the dispatch really put on each rank;
- fidelity: the largest difference, over slots and layers, between a slot's measured share of its
  expert's assignments and the share the dispatch algorithm gives it. ``static``: each source rank's
  tokens go to the slot its table row names, the sources' traffic being what each rank counted on the
  rows it routes itself (a DP rank's own tokens; its even share of the rows of a batch several TP
  ranks see: ``SourceTraffic`` of span 1, exact on any traffic); a ``SourceTraffic`` of span > 1 models
  a batch's counts as split evenly over its ranks (where per-source counts are missing); ``dynamic``:
  1/c of the expert to each of its c replicas (row i takes replica i mod c: per-source counts do not
  make this exact, the split follows the rows' parity).
  Near 0: the dispatch does what the layout expects; large: it does not;
- time score: per MoE layer, max/mean over EP ranks of the rank's local expert milliseconds
  per pass; ``moe_share``: the MoE part of the ranks' step wall time;
- the per-pass critical path of a record (``per_pass_critical``): the ranks' logged passes lined up,
  per pass and layer the slowest rank, summed over layers: what a step waits for in MoE, which the
  slowest rank *means* understate where the slowest rank changes from pass to pass (small passes on
  a balanced layout).

Pure numpy, no engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np

from ..errors import SceneEplbError
from ..layouts.dispatch import static_table
from ..layouts.layout import Geometry, replica_counts
from ..layouts.score import rank_score
from ..protocol import LiveTime, PassGroup, PassTimes, RankPassGroups, group_tokens


@dataclass(frozen=True)
class SourceTraffic:
    """The logical counts [L, E] of a batch routed by ``span`` EP ranks from ``base`` (its static-table
    rows, the counts split evenly over them); span 1: exactly the rows EP rank ``base`` routed."""

    base: int
    span: int
    counts: np.ndarray


@dataclass(frozen=True)
class RankGroups:
    """One rank's real passes by size (``protocol.PASS_GROUP_TOKENS``): ``passes`` [G], and [G, L] their
    MoE ``seconds``, ``assignments`` on its local slots and ``active`` slots, summed."""

    passes: np.ndarray
    seconds: np.ndarray
    assignments: np.ndarray
    active: np.ndarray

    @classmethod
    def of(cls, wire: RankPassGroups) -> RankGroups:
        """A rank's answer (``protocol.RankPassGroups``) as arrays."""
        counts = lambda x: np.asarray(x, dtype=np.int64)  # noqa: E731
        return cls(counts(wire.passes), np.asarray(wire.seconds, dtype=np.float64), counts(wire.assignments), counts(wire.active))

    def since(self, last: RankGroups) -> RankGroups:
        """The window from ``last`` (the same rank, earlier) to this: every field's difference."""
        return RankGroups(*(getattr(self, f.name) - getattr(last, f.name) for f in fields(self)))


def _since(now, last):
    """``now - last`` where both are there (None where either is not)."""
    return None if now is None or last is None else now - last


@dataclass(frozen=True)
class RankTime:
    """One rank's MoE timing over a window: seconds per MoE layer [L] over ``moe_passes`` passes,
    over its ``steps`` real steps their wall seconds and the MoE seconds within them, and the
    ``gap_seconds`` of its ``gaps`` busy pauses between steps; where the rank counts them, its
    stepping thread's run-queue ``wait_seconds`` inside the real steps, its ``active_slots`` [L] summed
    over its real passes and its passes by size (``groups``)."""

    moe_seconds: np.ndarray
    moe_passes: int
    steps: int
    step_seconds: float
    step_moe_seconds: float
    gap_seconds: float = 0.0
    gaps: int = 0
    wait_seconds: float | None = None
    active_slots: np.ndarray | None = None
    groups: RankGroups | None = None

    def since(self, last: RankTime) -> RankTime:
        """The window from ``last`` (the same rank, earlier) to this: every field's difference."""
        return RankTime(
            np.asarray(self.moe_seconds) - np.asarray(last.moe_seconds),
            self.moe_passes - last.moe_passes,
            self.steps - last.steps,
            self.step_seconds - last.step_seconds,
            self.step_moe_seconds - last.step_moe_seconds,
            self.gap_seconds - last.gap_seconds,
            self.gaps - last.gaps,
            _since(self.wait_seconds, last.wait_seconds),
            _since(self.active_slots, last.active_slots),
            None if self.groups is None or last.groups is None else self.groups.since(last.groups),
        )


def rank_loads(physical: np.ndarray, ep_size: int) -> np.ndarray:
    """Per-rank load of slot counts [L, P] on ``ep_size`` ranks (rank r holds slots [r*S, (r+1)*S)): float [L, ep]."""
    physical = np.asarray(physical, dtype=np.float64)
    if physical.shape[1] % ep_size:
        raise SceneEplbError(f"{physical.shape[1]} physical slots do not split over {ep_size} ranks")
    return physical.reshape(len(physical), ep_size, -1).sum(axis=2)


def measured_scores(physical: np.ndarray, geometry: Geometry) -> np.ndarray:
    """Max/mean EP rank load per layer of measured slot counts [L, P]: float [L]."""
    return rank_score(rank_loads(physical, geometry.ep_size))


def modelled_slot_counts(
    p2l: np.ndarray, geometry: Geometry, dispatch: str, sources: list[SourceTraffic], static_sources: np.ndarray | None = None
) -> np.ndarray:
    """The slot counts [L, P] the dispatch algorithm gives the sources' logical counts, for map
    rows ``p2l`` [L, P] (and, for ``static``, the layout's fitted table rows ``static_sources``)."""
    L, P = p2l.shape
    out = np.zeros((L, P), dtype=np.float64)
    if dispatch == "static":
        table = static_table(p2l, geometry, static_sources)  # [L, ep, E]: the slot source rank s uses for expert e
        layers = np.repeat(np.arange(L), geometry.num_experts)
        for src in sources:
            share = np.asarray(src.counts, dtype=np.float64) / src.span
            for s in range(src.base, src.base + src.span):
                np.add.at(out, (layers, table[:, s, :].ravel()), share.ravel())
        return out
    total = sum(np.asarray(src.counts, dtype=np.float64) for src in sources)
    per_replica = total / np.maximum(replica_counts(p2l, geometry.num_experts), 1)
    return np.take_along_axis(per_replica, p2l, axis=1)


def fidelity(physical: np.ndarray, modelled: np.ndarray, p2l: np.ndarray, num_experts: int) -> float | None:
    """Largest |measured - modelled| share of a slot in its expert's assignments [0, 1], over the
    slots whose expert had traffic; None when no expert had any."""
    physical = np.asarray(physical, dtype=np.float64)
    L = len(p2l)
    expert_total = np.zeros((L, num_experts))
    np.add.at(expert_total, (np.repeat(np.arange(L), p2l.shape[1]), p2l.ravel()), physical.ravel())
    per_slot = np.take_along_axis(expert_total, p2l, axis=1)
    seen = per_slot > 0
    if not seen.any():
        return None
    diff = np.abs(physical - modelled)[seen] / per_slot[seen]
    return float(diff.max())


def time_view(ranks: list[RankTime], loads: np.ndarray | None = None) -> LiveTime | None:
    """The status ``live.time`` object (``protocol.LiveTime``) from every rank's window: ``rank_ms`` [ranks][layers] mean
    local expert ms per pass, ``median`` and ``worst`` over layers of max/mean rank time,
    ``moe_share`` (MoE seconds over step seconds, over the ranks' real steps) and ``step_ms`` (mean
    wall ms of a real step); with the window's measured rank ``loads`` [L, ranks], also
    ``rank_assignments`` [ranks][layers]: the assignments each rank computed per pass, the x of the
    count -> time model (``advise``); ``gap_ms``, the mean busy pause between steps; where every rank
    counts them, ``rank_active_slots`` (mean active slots per pass, over the same passes as the
    assignments), ``pass_groups`` (``pass_groups``) and ``wait_share`` (``wait_share``). None without timing."""
    timed = [r for r in ranks if r.moe_passes > 0]
    if not timed or len(timed) != len(ranks):
        return None
    rank_ms = np.stack([1000.0 * np.asarray(r.moe_seconds, dtype=np.float64) / r.moe_passes for r in ranks])
    per_layer = rank_score(rank_ms.T)  # [L]: max/mean over ranks
    seconds, steps = sum(r.step_seconds for r in ranks), sum(r.steps for r in ranks)
    gap_seconds, gaps = sum(r.gap_seconds for r in ranks), sum(r.gaps for r in ranks)
    assignments = None
    if loads is not None and loads.shape == rank_ms.T.shape:
        assignments = tuple(tuple(round(float(x), 2) for x in loads[:, r] / ranks[r].moe_passes) for r in range(len(ranks)))
    return LiveTime(
        median=float(np.median(per_layer)),
        worst=float(per_layer.max()),
        moe_share=None if seconds <= 0 else float(sum(r.step_moe_seconds for r in ranks) / seconds),
        step_ms=None if steps <= 0 else 1000.0 * seconds / steps,
        rank_ms=tuple(tuple(round(float(x), 4) for x in row) for row in rank_ms),
        per_layer=tuple(round(float(x), 5) for x in per_layer),
        rank_assignments=assignments,
        sub_windows=(),
        provenance={},
        gap_ms=None if gaps <= 0 else round(1000.0 * gap_seconds / gaps, 4),
        rank_active_slots=_per_pass([r.active_slots for r in ranks], [r.moe_passes for r in ranks], rank_ms.shape),
        wait_share=wait_share(ranks),
        pass_groups=pass_groups(ranks),
    )


@dataclass(frozen=True)
class PerPassCritical:
    """The MoE critical path measured pass by pass: ``ms``, the mean over ``passes`` passes of the
    sum over layers of that pass's slowest rank (every layer waits for it), and ``of_means``, the
    same window's slowest rank means summed (what rank means show: never more than ``ms``)."""

    ms: float
    passes: int
    of_means: float


def per_pass_critical(logs: Sequence[PassTimes | None]) -> PerPassCritical | None:
    """From every rank's logged passes (``protocol.PassTimes``, numbered alike on every EP rank):
    the critical path over the passes every rank logged; None where a rank logged none or no pass
    is common to all. A rank's ``ms`` [passes][L] lined up by number: [ranks, passes, L]."""
    if not logs or any(log is None for log in logs):
        return None
    kept = [log for log in logs if log is not None]
    first = max(log.first for log in kept)
    end = min(log.first + len(log.ms) for log in kept)
    if end <= first:
        return None
    ms = np.stack([np.asarray(log.ms[first - log.first : end - log.first], dtype=np.float64) for log in kept])
    return PerPassCritical(float(ms.max(axis=0).sum(axis=1).mean()), end - first, float(ms.mean(axis=1).max(axis=0).sum()))


def _per_pass(sums: list, passes: list[int], shape: tuple) -> tuple[tuple[float, ...], ...] | None:
    """Each rank's ``sums`` [L] over its ``passes`` as [ranks][layers] means (None where a rank has none),
    rounded as the assignments are (so the active slots stay at most the assignments)."""
    if any(s is None for s in sums):
        return None
    means = np.stack([np.asarray(s, dtype=np.float64) / max(p, 1) for s, p in zip(sums, passes)])
    return tuple(tuple(round(float(x), 2) for x in row) for row in means) if means.shape == shape else None


def wait_share(ranks: list[RankTime]) -> float | None:
    """The largest share, over the ranks, of a rank's real steps' wall time its stepping thread waited on
    a run queue (in [0, 1]); None where a rank did not read it or timed no step."""
    shares = [None if r.wait_seconds is None or r.step_seconds <= 0 else r.wait_seconds / r.step_seconds for r in ranks]
    if not shares or any(x is None for x in shares):
        return None
    return round(min(max(max(x for x in shares if x is not None), 0.0), 1.0), 5)


def pass_groups(ranks: list[RankTime]) -> tuple[PassGroup, ...]:
    """The window's passes by size, each group every rank ran passes of: per pass each rank's mean MoE
    ms, assignments and active slots; empty where a rank keeps no groups."""
    groups = [r.groups for r in ranks]
    if not groups or any(g is None for g in groups):
        return ()
    kept: list[RankGroups] = [g for g in groups if g is not None]
    out = []
    for g in range(len(kept[0].passes)):
        passes = [int(x.passes[g]) for x in kept]
        if min(passes) > 0:
            means = (
                _group_mean([x.seconds[g] for x in kept], passes, 1000.0),
                _group_mean([x.assignments[g] for x in kept], passes),
                _group_mean([x.active[g] for x in kept], passes),
            )
            out.append(PassGroup(group_tokens(g), min(passes), *means))
    return tuple(out)


def _group_mean(sums: list[np.ndarray], passes: list[int], scale: float = 1.0) -> tuple[tuple[float, ...], ...]:
    """Each rank's sums [L] of one group over its passes there, times ``scale``: [ranks][layers]."""
    return tuple(tuple(round(float(v) * scale / p, 4) for v in row) for row, p in zip(sums, passes))
