"""The live answers: the status route's ``live`` object (``LiveAnswer``, its ``LiveTime`` and
``MeasuredView``), a worker's answer to ``LIVE_ACTION`` (``RankLiveAnswer``: its cumulative live
counts) and to ``RECORD_LIVE_ACTION`` (``RecordLive``: them at the last record's start and stop, and
its passes' MoE ms, ``PassTimes``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .fields import _Fields, _is_int, _non_negative
from .pass_groups import PassGroup, RankPassGroups, read_groups
from .status import _Answer


@dataclass(frozen=True)
class MeasuredView(_Answer):
    """The live object's ``measured``: the score of the measured replica traffic."""

    median: float
    worst: float
    per_layer: tuple[float, ...]

    @classmethod
    def from_wire(cls, f: _Fields) -> MeasuredView:
        return cls(f.number("median", 0), f.number("worst", 0), f.numbers("per_layer"))


def _active_slots(f: _Fields) -> tuple[tuple[float, ...], ...] | None:
    """A timing window's optional ``rank_active_slots`` [ranks][layers] (None where not captured)."""
    if "rank_active_slots" not in f.doc:
        return None
    return f.matrix("rank_active_slots", _non_negative, "a finite non-negative number", nullable=True)


def _critical(f: _Fields) -> tuple[float | None, int]:
    """A record window's optional ``critical_ms`` (None where not measured) and ``critical_passes``."""
    ms = f.number("critical_ms", 0, nullable=True) if "critical_ms" in f.doc else None
    return ms, (f.integer("critical_passes") if ms is not None and "critical_passes" in f.doc else 0)


def _wait_share(f: _Fields) -> float | None:
    """A timing window's optional ``wait_share`` in [0, 1] (None where the ranks did not read their run-queue wait)."""
    return f.number("wait_share", 0, 1, nullable=True) if "wait_share" in f.doc else None


@dataclass(frozen=True)
class DrafterLiveView(_Answer):
    """The live object's ``drafter``: a speculative drafter's MoE layers (``layers``, DeepSeek's MTP
    layer) scored apart from the target's, under the same layout and dispatch: the last window's
    score per layer, its median and worst, and the drafter's ``share`` of the window's assignments
    (its layers beside all of the target's). Kept out of the target's median, worst and drift alarm."""

    layers: tuple[int, ...]
    median: float | None
    worst: float | None
    per_layer: tuple[float, ...] | None
    share: float | None

    @classmethod
    def from_wire(cls, f: _Fields) -> DrafterLiveView:
        return cls(
            f.integers("layers"),
            f.number("median", 0, nullable=True),
            f.number("worst", 0, nullable=True),
            f.numbers_or_null("per_layer"),
            f.number("share", 0, 1, nullable=True),
        )


@dataclass(frozen=True)
class LiveTime(_Answer):
    """The live object's ``time`` (``measured.time_view``, stamped by ``fitness.LiveFitness``): ``rank_ms``
    [ranks][layers] mean local expert ms per pass, ``median`` / ``worst`` over layers of its max/mean
    over ranks (``per_layer``), ``moe_share`` of step time, ``step_ms`` the mean wall ms of a real step,
    ``rank_assignments`` [ranks][layers] (None: the window had no measured rank loads), the recent
    windows' ``sub_windows`` step ms, the server's ``provenance`` and ``gap_ms``, the mean busy pause
    between steps (None: none was timed), ``rank_active_slots`` [ranks][layers] (None: not
    captured), ``wait_share`` the largest share of a rank's step time its stepping thread waited on a
    run queue (None: not read) and ``pass_groups`` the window's passes by size (``PassGroup``; empty:
    not captured); for a record's own window, ``critical_ms`` the MoE critical path measured pass by
    pass over ``critical_passes`` of its passes (``measured.per_pass_critical``; None: not logged).
    ``advise`` reads it as a ``TimingWindow``."""

    median: float
    worst: float
    moe_share: float | None
    step_ms: float | None
    rank_ms: tuple[tuple[float, ...], ...]
    per_layer: tuple[float, ...]
    rank_assignments: tuple[tuple[float, ...], ...] | None
    sub_windows: tuple[float, ...]
    provenance: dict
    gap_ms: float | None = None
    rank_active_slots: tuple[tuple[float, ...], ...] | None = None
    wait_share: float | None = None
    pass_groups: tuple[PassGroup, ...] = ()
    critical_ms: float | None = None
    critical_passes: int = 0

    @classmethod
    def from_wire(cls, f: _Fields) -> LiveTime:
        median, worst, share = f.number("median", 0), f.number("worst", 0), f.number("moe_share", 0, 1, nullable=True)
        provenance = f.obj("provenance", "provenance")
        return cls(
            median,
            worst,
            share,
            f.number("step_ms", 0, nullable=True),
            f.matrix("rank_ms", _non_negative, "a finite non-negative number") or (),
            f.numbers("per_layer", 0),
            f.matrix("rank_assignments", _non_negative, "a finite non-negative number", nullable=True),
            f.numbers("sub_windows", 0),
            {} if provenance is None else dict(provenance.doc),
            f.number("gap_ms", 0, nullable=True) if "gap_ms" in f.doc else None,  # a status saved before it has none
            _active_slots(f),
            _wait_share(f),
            read_groups(f),
            *_critical(f),
        )


@dataclass(frozen=True)
class LiveAnswer(_Answer):
    """The status answer's ``LIVE_KEY`` object (``fitness.LiveFitness.answer``): the last window's
    score per MoE layer, the layout's expectation, the drift alarm, the measured replica
    traffic and the window's timing (``time``: None without ``time_moe``), and the timing of the
    last record's own passes (``record_time``: what ``advise`` prices that record's dump with)."""

    median: float | None
    worst: float | None
    expected_median: float | None
    expected_worst: float | None
    drift: bool
    passes: int
    window_seconds: float
    windows: int
    threshold: float | None
    dispatch: str | None
    layers: tuple[int, ...]
    per_layer: tuple[float, ...] | None
    measured: MeasuredView | None
    fidelity: float | None
    time: LiveTime | None
    record_time: LiveTime | None = None  # the last record's own window, start to stop (None while one runs)
    drafter: DrafterLiveView | None = None  # a drafter's MoE layers, apart (None: the server counts none)

    @classmethod
    def from_wire(cls, doc: Any, source: str | None = None) -> LiveAnswer:
        f = _Fields(doc, "live answer", source)
        measured, time = f.obj("measured", "measured"), f.obj("time", "time")
        record_time = f.obj("record_time", "record_time", default=None)  # a status saved before it was added has none
        drafter = f.obj("drafter", "drafter", default=None)
        live = cls(
            f.number("median", 0, nullable=True),
            f.number("worst", 0, nullable=True),
            f.number("expected_median", 0, nullable=True),
            f.number("expected_worst", 0, nullable=True),
            f.flag("drift"),
            f.integer("passes"),
            f.number("window_seconds", 0),
            f.integer("windows"),
            f.number("threshold", 0, nullable=True),
            f.text("dispatch", nullable=True),
            f.integers("layers"),
            f.numbers_or_null("per_layer"),
            None if measured is None else MeasuredView.from_wire(measured),
            f.number("fidelity", nullable=True),
            None if time is None else LiveTime.from_wire(time),
            None if record_time is None else LiveTime.from_wire(record_time),
            None if drafter is None else DrafterLiveView.from_wire(drafter),
        )
        if live.median is not None and (live.worst is None or live.per_layer is None):
            f.fail("has a median but no worst or per_layer")
        return live


@dataclass(frozen=True)
class RankLiveAnswer(_Answer):
    """A worker's answer to ``LIVE_ACTION``: its cumulative live counts [L_moe, E] (``counts``) and
    physical [L_moe, P] (MoE layers in order), the logical counts of the rows it routes itself
    (``own_counts`` [L_moe, E]: its static source rows), whether its counts count (``contributes``),
    ``source`` [base, span] of the static-table rows behind its batch, and with ``time_moe`` its MoE
    seconds per layer [L_moe] over ``moe_passes`` passes, its real ``steps``' seconds and the
    ``gap_seconds`` of its ``gaps`` busy pauses between steps; where the rank counts them, its
    ``active_slots`` [L_moe] (local slots with at least one real row, summed over its real passes),
    its passes by size (``groups``: ``RankPassGroups``) and its stepping thread's ``wait_seconds`` on
    a run queue inside its real steps (each None where not captured); a speculative drafter's MoE
    layers' cumulative counts [D, E] (``drafter_counts``, its layers ``drafter_layers``; None without)."""

    counts: tuple[tuple[int, ...], ...]
    physical: tuple[tuple[int, ...], ...] | None
    own_counts: tuple[tuple[int, ...], ...] | None
    passes: int
    moe_seconds: tuple[float, ...] | None
    moe_passes: int
    steps: int
    step_seconds: float
    step_moe_seconds: float
    gap_seconds: float
    gaps: int
    contributes: bool
    ep_rank: int
    source: tuple[int, ...] | None
    moe_layers: tuple[int, ...]
    active_slots: tuple[int, ...] | None = None
    groups: RankPassGroups | None = None
    wait_seconds: float | None = None
    drafter_layers: tuple[int, ...] = ()
    drafter_counts: tuple[tuple[int, ...], ...] | None = None

    @classmethod
    def from_wire(cls, doc: Any, source: str | None = None) -> RankLiveAnswer:
        f = _Fields(doc, "live answer of a rank", source)
        layers = f.integers("moe_layers")
        groups = f.obj("groups", "groups", default=None)
        drafter = f.integers("drafter_layers") if "drafter_layers" in doc else ()
        return cls(
            f.count_matrix("counts", len(layers)) or (),
            f.count_matrix("physical", len(layers), nullable=True),
            f.count_matrix("own_counts", len(layers), nullable=True),
            f.integer("passes"),
            f._list("moe_seconds", _non_negative, "finite numbers >= 0", True, len(layers)),
            f.integer("moe_passes"),
            f.integer("steps"),
            f.number("step_seconds", 0),
            f.number("step_moe_seconds", 0),
            f.number("gap_seconds", 0),
            f.integer("gaps"),
            f.flag("contributes"),
            f.integer("ep_rank"),
            f.integers_or_null("source", length=2),
            layers,
            f._list("active_slots", _is_int, "integers >= 0", True, len(layers)) if "active_slots" in doc else None,
            None if groups is None else RankPassGroups.from_wire(groups, len(layers)),
            f.number("wait_seconds", 0, nullable=True) if "wait_seconds" in doc else None,
            drafter,
            f.count_matrix("drafter_counts", len(drafter), nullable=True) if drafter else None,
        )


@dataclass(frozen=True)
class PassTimes(_Answer):
    """One rank's MoE ms per layer of consecutive passes: ``ms`` [passes][L_moe], the first numbered
    ``first`` (the rank's count of passes that ran MoE, which every EP rank numbers alike).

    Example: passes 7 and 8 of two MoE layers, ``first = 7; ms = ((0.41, 0.38), (0.52, 0.37))``."""

    first: int
    ms: tuple[tuple[float, ...], ...]

    @classmethod
    def from_wire(cls, f: _Fields, layers: int) -> PassTimes:
        times = cls(f.integer("first"), f.matrix("ms", _non_negative, "a finite non-negative number") or ())
        if len(times.ms[0]) != layers:
            f.fail(f"ms has {len(times.ms[0])} values a pass, for {layers} MoE layers")
        return times


@dataclass(frozen=True)
class RecordLive(_Answer):
    """A worker's answer to ``RECORD_LIVE_ACTION``: its cumulative live counts as the last record
    started and as it stopped, each read at that boundary, so their difference is exactly the
    passes the record counted (the poller's windows fall where they fall); with host MoE timing,
    the record's passes' MoE ms (``passes``: its last ``moe_timing.PASS_LOG`` at most; None where
    not logged)."""

    start: RankLiveAnswer
    stop: RankLiveAnswer
    passes: PassTimes | None = None

    @classmethod
    def from_wire(cls, doc: Any, source: str | None = None) -> RecordLive:
        f = _Fields(doc, "record live answer", source)
        start, stop = (f.get(k, lambda v: isinstance(v, dict), "an object") for k in ("start", "stop"))
        stop_answer = RankLiveAnswer.from_wire(stop, source)
        passes = f.obj("passes", "passes", default=None)
        return cls(
            RankLiveAnswer.from_wire(start, source),
            stop_answer,
            None if passes is None else PassTimes.from_wire(passes, len(stop_answer.moe_layers)),
        )
