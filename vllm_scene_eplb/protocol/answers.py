"""What crosses between the workers, the API server and the clients besides a status: the live
object and the status answer around it, the export and dump answers, a rank's live counts, the
native load, and the worker answer that carries any of them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Generic, Protocol, TypeVar

from .fields import _Fields, _is_int, _non_negative
from .flow import FLOW_KEY, FlowView
from .pass_groups import PassGroup, RankPassGroups, read_groups
from .routes import AGREE_KEY, AGREEMENT_KEYS, LIVE_KEY, RANKS_KEY
from .status import RankView, WorkerStatus, _Answer


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


def _wait_share(f: _Fields) -> float | None:
    """A timing window's optional ``wait_share`` in [0, 1] (None where the ranks did not read their run-queue wait)."""
    return f.number("wait_share", 0, 1, nullable=True) if "wait_share" in f.doc else None


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
    not captured). ``advise`` reads it as a ``TimingWindow``."""

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

    @classmethod
    def from_wire(cls, doc: Any, source: str | None = None) -> LiveAnswer:
        f = _Fields(doc, "live answer", source)
        measured, time = f.obj("measured", "measured"), f.obj("time", "time")
        record_time = f.obj("record_time", "record_time", default=None)  # a status saved before it was added has none
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
        )
        if live.median is not None and (live.worst is None or live.per_layer is None):
            f.fail("has a median but no worst or per_layer")
        return live


@dataclass(frozen=True)
class StatusAnswer(_Answer):
    """The status route's answer (also what start and stop answer): EP rank 0's status, every rank's
    view under ``RANKS_KEY``, their agreement under ``AGREE_KEY``, the live object under ``LIVE_KEY``
    and the node's flow under ``FLOW_KEY`` (None: vLLM's stats are off, or a status saved before it)."""

    status: WorkerStatus
    ranks: tuple[RankView, ...]
    ranks_agree: bool
    live: LiveAnswer | None
    flow: FlowView | None = None

    @classmethod
    def of_ranks(cls, statuses: list[WorkerStatus], live: LiveAnswer | None = None) -> StatusAnswer:
        """The answer from every worker's status: EP rank 0's, every rank's view (in EP rank order)
        and whether they agree on ``AGREEMENT_KEYS``."""
        ranked = sorted(statuses, key=lambda st: st.ep_rank)
        first = ranked[0]
        agree = all(getattr(st, k) == getattr(first, k) for st in ranked for k in AGREEMENT_KEYS)
        return cls(first, tuple(map(RankView.of, ranked)), agree, live)

    @classmethod
    def from_wire(cls, doc: Any, source: str | None = None) -> StatusAnswer:
        f = _Fields(doc, "status answer", source)
        ranks = f.get(RANKS_KEY, lambda v: isinstance(v, list) and len(v) > 0, "a non-empty list")
        live = f.get(LIVE_KEY, lambda v: isinstance(v, dict), "an object", nullable=True)
        flow = f.get(FLOW_KEY, lambda v: isinstance(v, dict), "an object", nullable=True, default=None)
        return cls(
            WorkerStatus.from_wire(doc, source),
            tuple(RankView.from_wire(r, source, f"status answer's {RANKS_KEY}[{i}]") for i, r in enumerate(ranks)),
            f.flag(AGREE_KEY),
            None if live is None else LiveAnswer.from_wire(live, source),
            None if flow is None else FlowView.from_wire(flow, source, f"status answer's {FLOW_KEY}"),
        )

    def to_wire(self) -> dict:
        return {
            **self.status.to_wire(),
            RANKS_KEY: [r.to_wire() for r in self.ranks],
            AGREE_KEY: self.ranks_agree,
            LIVE_KEY: None if self.live is None else self.live.to_wire(),
            FLOW_KEY: None if self.flow is None else self.flow.to_wire(),
        }


EXPORT_STATES = ("running", "done", "failed")


def _export_job(f: _Fields, states: tuple[str, ...] = EXPORT_STATES) -> dict[str, Any]:
    """An export job's fields (``ExportJobAnswer``), read."""
    path = f.get("path", lambda v: isinstance(v, str) and v != "", "the path of the file written")
    return {
        "export_id": f.text("export_id"),
        "state": f.text("state", choices=states),
        "path": path,
        "error": f.text("error", nullable=True),
        "export_seconds": f.number("export_seconds", 0, nullable=states != ("done",)),
    }


@dataclass(frozen=True)
class ExportJobAnswer(_Answer):
    """A worker's answer to ``EXPORT_STATUS_ACTION``: how its part of one export stands (``running``
    until ``done`` or ``failed`` with its ``error``), where it writes and how long it took."""

    export_id: str
    state: str
    path: str
    error: str | None
    export_seconds: float | None

    @classmethod
    def from_wire(cls, doc: Any, source: str | None = None) -> ExportJobAnswer:
        return cls(**_export_job(_Fields(doc, "export job answer", source)))


@dataclass(frozen=True)
class DumpStarted(ExportJobAnswer):
    """A worker's answer to ``dump``: its export job, its EP rank, the record's ``shape`` [T, L, E]
    and ``physical_shape`` [T, L, P] (None: no physical counts), its ring figures and the total of
    the logical counts it contributes."""

    ep_rank: int
    shape: tuple[int, ...]
    physical_shape: tuple[int, ...] | None
    entries_written: int
    passes_recorded: int
    local_total: int

    @classmethod
    def from_wire(cls, doc: Any, source: str | None = None) -> DumpStarted:
        f = _Fields(doc, "dump start answer", source)
        return cls(**_export_job(f), **_dump_figures(f))


def _dump_figures(f: _Fields) -> dict[str, Any]:
    """What a dump answer adds to its export job (``DumpStarted``'s own fields), read."""
    return {
        "ep_rank": f.integer("ep_rank"),
        "shape": f.integers("shape", length=3),
        "physical_shape": f.integers_or_null("physical_shape", length=3),
        "entries_written": f.integer("entries_written"),
        "passes_recorded": f.integer("passes_recorded"),
        "local_total": f.integer("local_total"),
    }


@dataclass(frozen=True)
class DumpAnswer(DumpStarted):
    """The dump route's answer: where the workers wrote the counts file, its shapes and the export's
    figures (EP rank 0's start answer, ``done``, the slowest rank's seconds, every rank's total)."""

    export_seconds: float
    ranks: int

    @classmethod
    def from_wire(cls, doc: Any, source: str | None = None) -> DumpAnswer:
        f = _Fields(doc, "dump answer", source)
        return cls(**_export_job(f, ("done",)), **_dump_figures(f), ranks=f.integer("ranks", 1))

    @classmethod
    def of_ranks(cls, started: list[DumpStarted], jobs: list[ExportJobAnswer]) -> DumpAnswer:
        """The answer once every rank's job is done: EP rank 0's start answer, the slowest rank's seconds,
        the total over every rank."""
        first = min(started, key=lambda r: r.ep_rank)
        own = {f.name: getattr(first, f.name) for f in fields(DumpStarted)}
        return cls(
            **{
                **own,
                "state": "done",
                "export_seconds": max(j.export_seconds or 0.0 for j in jobs),
                "local_total": sum(r.local_total for r in started),
            },
            ranks=len(jobs),
        )


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
    a run queue inside its real steps (each None where not captured)."""

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

    @classmethod
    def from_wire(cls, doc: Any, source: str | None = None) -> RankLiveAnswer:
        f = _Fields(doc, "live answer of a rank", source)
        layers = f.integers("moe_layers")
        groups = f.obj("groups", "groups", default=None)
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
        )


@dataclass(frozen=True)
class RecordLive(_Answer):
    """A worker's answer to ``RECORD_LIVE_ACTION``: its cumulative live counts as the last record
    started and as it stopped, each read at that boundary, so their difference is exactly the
    passes the record counted (the poller's windows fall where they fall)."""

    start: RankLiveAnswer
    stop: RankLiveAnswer

    @classmethod
    def from_wire(cls, doc: Any, source: str | None = None) -> RecordLive:
        f = _Fields(doc, "record live answer", source)
        start, stop = (f.get(k, lambda v: isinstance(v, dict), "an object") for k in ("start", "stop"))
        return cls(RankLiveAnswer.from_wire(start, source), RankLiveAnswer.from_wire(stop, source))


@dataclass(frozen=True)
class NativeCounts(_Answer):
    """A rank's engine counters over the last record, in logical ids: ``counts`` [L_moe, E] when
    ``available``, else the ``reason`` there are none."""

    available: bool
    reason: str | None = None
    counts: tuple[tuple[int, ...], ...] | None = None

    def to_wire(self) -> dict:
        if not self.available:
            return {"available": False, "reason": self.reason}
        return {"available": True, "counts": [list(r) for r in self.counts or ()]}

    @classmethod
    def read(cls, f: _Fields, rows: int) -> NativeCounts:
        if not f.flag("available"):
            return cls(False, reason=f.text("reason"))
        return cls(True, counts=f.count_matrix("counts", rows))


@dataclass(frozen=True)
class RankNativeLoad(_Answer):
    """A worker's answer to ``NATIVE_ACTION``: its EP rank, its MoE layers and its engine counters."""

    ep_rank: int
    moe_layers: tuple[int, ...]
    load: NativeCounts

    def to_wire(self) -> dict:
        return {"ep_rank": self.ep_rank, "moe_layers": list(self.moe_layers), **self.load.to_wire()}

    @classmethod
    def from_wire(cls, doc: Any, source: str | None = None) -> RankNativeLoad:
        f = _Fields(doc, "native_load answer of a rank", source)
        layers = f.integers("moe_layers")
        return cls(f.integer("ep_rank"), layers, NativeCounts.read(f, len(layers)))


@dataclass(frozen=True)
class NativeLoadAnswer(_Answer):
    """The native_load route's answer: the engine's own expert-load counters over the last record,
    summed over ``ranks``: ``counts`` [L_moe, E] of ``moe_layers`` when ``available``, else ``reason``."""

    available: bool
    ranks: int
    reason: str | None = None
    moe_layers: tuple[int, ...] | None = None
    counts: tuple[tuple[int, ...], ...] | None = None

    @classmethod
    def from_wire(cls, doc: Any, source: str | None = None) -> NativeLoadAnswer:
        f = _Fields(doc, "native_load answer", source)
        if not f.flag("available"):
            return cls(False, f.integer("ranks", 1), reason=f.text("reason"))
        layers = f.integers("moe_layers")
        return cls(True, f.integer("ranks", 1), moe_layers=layers, counts=f.count_matrix("counts", len(layers)))

    def to_wire(self) -> dict:
        if not self.available:
            return {"available": False, "reason": self.reason, "ranks": self.ranks}
        return {
            "available": True,
            "moe_layers": list(self.moe_layers or ()),
            "counts": [list(r) for r in self.counts or ()],
            "ranks": self.ranks,
        }


class WireObject(Protocol):
    """What a worker answer's payload is: an object with its wire form."""

    def to_wire(self) -> dict: ...


A = TypeVar("A", bound=WireObject)


@dataclass(frozen=True)
class WorkerAnswer(Generic[A]):
    """One worker's answer to a control action, as collective_rpc carries it (``to_wire``): the
    action's ``payload`` when it ran (``ok``), else the refusal's ``error`` and the HTTP status the
    route answers with it."""

    payload: A | None
    error: str | None = None
    http_status: int = 409

    @classmethod
    def refused(cls, error: str, http_status: int = 409) -> WorkerAnswer:
        return cls(None, error, http_status)

    @property
    def ok(self) -> bool:
        return self.payload is not None

    def to_wire(self) -> dict:
        if self.payload is None:
            return {"ok": False, "error": self.error, "http_status": self.http_status}
        return {"ok": True, **self.payload.to_wire()}

    @classmethod
    def from_wire(cls, doc: Any, read: Callable[[Any, str | None], A], source: str | None = None) -> WorkerAnswer[A]:
        """The answer, its payload read with ``read`` (a payload's ``from_wire``)."""
        f = _Fields(doc, "worker answer", source, prefix="a ")
        if not f.flag("ok"):
            return cls(None, f.text("error"), f.integer("http_status", 400))
        return cls(read({k: v for k, v in doc.items() if k != "ok"}, source))
