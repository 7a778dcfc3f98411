"""The plugin's wire contract, in one place: route paths, status keys, the startup log line, and
every answer that crosses (worker -> API server -> client) as a typed object with ``from_wire`` /
``to_wire`` side by side.

The workers, the API server (engine adapters, ``runtime``) and the client side (``scene-eplb
record``, ``audit``, ``bench``) all import it, so a route, key or field renamed here is renamed
everywhere. Stdlib only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Generic, NoReturn, Protocol, TypeVar

from .errors import SceneEplbError


@dataclass(frozen=True)
class Route:
    """One control route: the worker action it triggers, its HTTP method and path."""

    action: str
    method: str
    path: str


# SGLang's route names for the recorder, plus our status and native-load routes.
ROUTES = (
    Route("start", "POST", "/start_expert_distribution_record"),
    Route("stop", "POST", "/stop_expert_distribution_record"),
    Route("dump", "POST", "/dump_expert_distribution_record"),
    Route("status", "GET", "/scene_eplb/status"),
    # The engine's own expert-load counters over the last record, in logical ids (vLLM-Ascend with dynamic EPLB).
    Route("native_load", "GET", "/scene_eplb/native_load"),
)
ROUTE_BY_ACTION = {r.action: r for r in ROUTES}
ACTIONS = tuple(ROUTE_BY_ACTION)

# Every rank's view, one entry per worker, under this key of the status answer (``RANK_KEYS``).
RANKS_KEY = "ranks"
# True when every rank agrees on these keys (what a run's audit relies on).
AGREE_KEY = "ranks_agree"
AGREEMENT_KEYS = ("layout_hash", "redundant_slots", "dispatch", "observer", "ring_entries", "ep_size")
# The dump route's query flag that writes a record with skipped passes anyway (refused without it).
KEEP_SKIPPED = "keep_skipped"
# Worker actions behind the routes (not routes of their own): the dump route polls an export with
# the first; the live-fitness poller reads every rank's cumulative counts with the second, and with
# the third the counts each rank had as the last record started and stopped (the record's own window).
EXPORT_STATUS_ACTION = "export_status"
LIVE_ACTION = "live"
RECORD_LIVE_ACTION = "record_live"
# The native_load route's action: each worker's logical counts from the engine's own counters.
NATIVE_ACTION = "native_load"
# The status answer's live-fitness object (built by ``fitness.LiveFitness.answer``).
LIVE_KEY = "live"
# The status keys a dump file's metadata carries (besides what the export adds).
DUMP_META_KEYS = (
    "model",
    "role",
    "moe_layers",
    "ep_size",
    "layout_hash",
    "redundant_slots",
    "dispatch",
    "passes_recorded",
    "engine",
    "plugin_version",
    "top_k",
    "expert_groups",
)
# The status keys an audit compares between the status route and every worker's startup line.
AUDITED_KEYS = ("layout_hash", "redundant_slots", "dispatch")

# Observer states, as status and the startup line report them.
OBSERVER_OFF, OBSERVER_IDLE, OBSERVER_RECORDING = "off", "idle", "recording"

_LINE = (
    "scene-eplb: role={role} observer={observer} layout_hash={layout_hash} redundant_slots={redundant_slots} "
    "dispatch={dispatch} ep_size={ep_size} ({where})"
)
_LINE_RE = re.compile(
    r"scene-eplb: role=(\S+) observer=(\S+) layout_hash=(\S+)(?: \(linear\))? redundant_slots=(\d+) "
    r"dispatch=(\S+)"
)


def startup_line(status: WorkerStatus | Mapping[str, Any], where: str) -> str:
    """The one line each worker logs at startup (what it loaded); ``where`` names the worker."""
    if isinstance(status, WorkerStatus):
        status = status.to_wire()
    return _LINE.format(
        role=status["role"],
        observer=status["observer"],
        layout_hash=status["layout_hash"] or "none (linear)",
        redundant_slots=status["redundant_slots"],
        dispatch=status["dispatch"] or "none",
        ep_size=status["ep_size"],
        where=where,
    )


@dataclass(frozen=True)
class StartupLine:
    """What one worker's startup line says it loaded: the status keys the line carries (None for "none")."""

    role: str
    observer: str
    layout_hash: str | None
    redundant_slots: int
    dispatch: str | None

    def to_wire(self) -> dict:
        return _wire(self)


def parse_startup_lines(text: str) -> list[StartupLine]:
    """Every startup line in a log, in order."""
    return [
        StartupLine(m[0], m[1], None if m[2] == "none" else m[2], int(m[3]), None if m[4] == "none" else m[4])
        for m in _LINE_RE.findall(text)
    ]


# The line each vLLM-Ascend worker logs the first time a real (non-dummy) pass ran a MoE comm method
# (MC2, FUSED_MC2, ALLTOALL, ALLGATHER), and how verify.sh's mc2 check finds it in a server log.
COMM_METHOD_LINE = "scene-eplb: MoE comm method %s in a real pass"
COMM_METHOD_RE = re.compile(r"scene-eplb: MoE comm method (\w+) in a real pass")


# ================================================================ answers
# What crosses between the workers, the API server and the clients, as typed objects: a reader
# takes an answer only through ``from_wire``, which checks every field's type, shape, finiteness
# and range and names the field at fault in one line (a server that is not this plugin, or a broken
# one, never crashes a command; a broken worker answer is a 500, never a crash of the route);
# ``to_wire`` gives the object back, key for key what crosses. Worker answers cross vLLM's
# collective_rpc as ``to_wire``'s plain dicts: the engine core hands a utility call's result to the
# API server as msgpack without type information (vLLM's ``v1/serial_utils.py``), where a dataclass
# would arrive as a map of its own fields, not the wire's keys (``tests/unit/test_worker_answers.py``).
# The routes' answers cross as JSON.

MAX_WIRE_INT = 2**53  # every integer of an answer (a count, a total, a rank) is exact in float64
_REQUIRED: Any = object()  # ``_Fields.get``'s default: the key must be there


def _show(value: Any) -> str:
    """A short description of a bad value for a message (never the whole of a large one)."""
    if isinstance(value, (dict, list)):
        return f"a JSON {'object' if isinstance(value, dict) else 'array'} of {len(value)}"
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "..."


def _is_int(v: Any, low: int = 0, high: int = MAX_WIRE_INT) -> bool:
    return type(v) is int and low <= v <= high


def _is_number(v: Any, low: float = -math.inf, high: float = math.inf) -> bool:
    return type(v) in (int, float) and math.isfinite(v) and low <= v <= high


def _non_negative(v: Any) -> bool:
    return _is_number(v, 0)


def _floats(rows) -> tuple[tuple[float, ...], ...]:
    """[rows][cols] numbers as floats."""
    return tuple(tuple(map(float, row)) for row in rows)


class _Fields:
    """One wire object's fields, read with a check each; a failure names the object (``what``, after
    ``prefix``), the field and what it held, with ``source`` (the URL or file) as its place. The one
    reader of every answer and of the timing window."""

    def __init__(self, doc: Any, what: str, source: str | None, prefix: str = "the server's "):
        self.what, self.source, self.prefix = what, source, prefix
        if not isinstance(doc, dict):
            self.fail(f"must be a JSON object, got {_show(doc)}")
        self.doc = doc

    def fail(self, problem: str) -> NoReturn:
        raise SceneEplbError(f"{self.prefix}{self.what} {problem}", self.source)

    def get(self, key: str, ok, expected: str, nullable: bool = False, default: Any = _REQUIRED) -> Any:
        """``key``'s value when ``ok`` (or None when ``nullable``); ``default`` where the key may be absent."""
        if key not in self.doc:
            if default is not _REQUIRED:
                return default
            self.fail(f"has no {key!r} (not this plugin's answer, or a plugin older than this client?)")
        value = self.doc[key]
        if (value is None and nullable) or ok(value):
            return value
        self.fail(f"{key} must be {expected}{' or null' if nullable else ''}, got {_show(value)}")

    def integer(self, key: str, low: int = 0, nullable: bool = False) -> int:
        return self.get(key, lambda v: _is_int(v, low), f"an integer >= {low}", nullable)

    def number(self, key: str, low: float = -math.inf, high: float = math.inf, nullable: bool = False) -> float:
        return self.get(key, lambda v: _is_number(v, low, high), f"a finite number in [{low:g}, {high:g}]", nullable)

    def text(self, key: str, nullable: bool = False, choices: tuple[str, ...] | None = None) -> str:
        expected = f"one of {', '.join(choices)}" if choices else "a string"
        return self.get(key, lambda v: isinstance(v, str) and (choices is None or v in choices), expected, nullable)

    def flag(self, key: str) -> bool:
        return self.get(key, lambda v: type(v) is bool, "true or false")

    def _list(self, key: str, ok, expected: str, nullable: bool, length: int | None) -> tuple | None:
        """A list of values each ``ok`` (of ``length`` when given); a bad value is named by its index."""
        sized = "" if length is None else f"{length} "
        value = self.get(
            key, lambda v: isinstance(v, list) and length in (None, len(v)), f"a list of {sized}{expected}", nullable
        )
        if value is None:
            return None
        for i, v in enumerate(value):
            if not ok(v):
                self.fail(f"{key}[{i}] is {_show(v)}: {key} must be a list of {expected}")
        return tuple(value)

    def integers(self, key: str, length: int | None = None) -> tuple[int, ...]:
        return self._list(key, _is_int, "integers >= 0", False, length) or ()

    def integers_or_null(self, key: str, length: int | None = None) -> tuple[int, ...] | None:
        return self._list(key, _is_int, "integers >= 0", True, length)

    def numbers(self, key: str, low: float = -math.inf) -> tuple[float, ...]:
        expected = "finite numbers" if low == -math.inf else f"finite numbers >= {low:g}"
        return self._list(key, lambda v: _is_number(v, low), expected, False, None) or ()

    def numbers_or_null(self, key: str) -> tuple[float, ...] | None:
        return self._list(key, _is_number, "finite numbers", True, None)

    def obj(self, key: str, what: str, default: Any = _REQUIRED) -> _Fields | None:
        """A nested object (or null), read the same way."""
        value = self.get(key, lambda v: isinstance(v, dict), "an object", True, default)
        return None if value is None or value is default else _Fields(value, f"{self.what} {what}", self.source, self.prefix)

    def matrix(self, key: str, ok, expected: str, rows: int | None = None, nullable: bool = False) -> tuple[tuple, ...] | None:
        """[rows, W] values each ``ok``: a non-empty list of non-empty lists of one length (``rows``
        of them when given); a bad row or value is named by its place."""
        sized = "[ranks][layers]" if rows is None else f"[{rows}][...]"
        value = self.get(
            key,
            lambda v: isinstance(v, list) and (bool(v) or rows == 0) and rows in (None, len(v)),
            f"a non-empty {sized} list of lists",
            nullable,
        )
        if not value:
            return None if value is None else ()
        width = len(value[0]) if isinstance(value[0], list) else 0
        for r, row in enumerate(value):
            if not isinstance(row, list) or not row or len(row) != width:
                self.fail(f"{key} row {r} must be {width or 'some'} values like row 0, got {_show(row)}: ragged or not a list")
            for i, v in enumerate(row):
                if not ok(v):
                    self.fail(f"{key} row {r}: {key}[{r}][{i}] must be {expected}, got {_show(v)}")
        return tuple(map(tuple, value))

    def count_matrix(self, key: str, rows: int, nullable: bool = False) -> tuple[tuple[int, ...], ...] | None:
        """[rows, E] counts: non-negative integers, rectangular, summing to at most MAX_WIRE_INT."""
        value = self.matrix(key, _is_int, "an integer >= 0", rows, nullable)
        if value is not None and sum(map(sum, value)) > MAX_WIRE_INT:
            self.fail(f"{key} sums above 2**53: not counts")
        return value


def _wire(obj) -> dict:
    """A dataclass answer as its JSON object: its fields, tuples as lists, nested answers as theirs."""

    def plain(v):
        if isinstance(v, tuple):
            return [plain(x) for x in v]
        return v.to_wire() if hasattr(v, "to_wire") else v

    return {f.name: plain(getattr(obj, f.name)) for f in fields(obj)}


_OBSERVER_STATES = (OBSERVER_OFF, OBSERVER_IDLE, OBSERVER_RECORDING)
_OPTIONAL_TEXT = ("model", "layout_hash", "layout_path", "dispatch", "server_start")
# How each status key is read (a worker's status and every rank's view share them).
_STATUS_FIELDS = {
    **{k: _Fields.text for k in ("plugin_version", "engine", "role")},
    **{k: lambda f, k: f.text(k, nullable=True) for k in _OPTIONAL_TEXT},
    **{k: _Fields.integer for k in ("ep_rank", "dp_rank", "tp_rank", "redundant_slots", "ring_entries")},
    **{
        k: _Fields.integer
        for k in ("entries_written", "passes_recorded", "steps_per_entry", "skipped_passes", "skipped_recorded")
    },
    **{k: lambda f, k: f.integer(k, 1, nullable=True) for k in ("top_k", "expert_groups")},
    **{k: _Fields.flag for k in ("recording", "live_counts")},
    "ep_size": lambda f, k: f.integer(k, 1),
    "observer": lambda f, k: f.text(k, choices=_OBSERVER_STATES),
    "moe_layers": _Fields.integers,
}


class _Answer:
    """What every answer shares: its JSON object is its fields (``_wire``)."""

    def to_wire(self) -> dict:
        return _wire(self)


def _read_fields(cls, f: _Fields):
    """A status-like answer whose every field is a status key, each read its way (``_STATUS_FIELDS``)."""
    return cls(**{x.name: _STATUS_FIELDS[x.name](f, x.name) for x in fields(cls)})


@dataclass(frozen=True)
class WorkerStatus(_Answer):
    """One worker's status (``STATUS_KEYS``, in order): what the status route and the startup line report."""

    plugin_version: str
    engine: str
    model: str | None
    role: str
    ep_size: int
    ep_rank: int
    dp_rank: int
    tp_rank: int
    layout_hash: str | None
    layout_path: str | None
    redundant_slots: int
    dispatch: str | None
    observer: str
    recording: bool
    ring_entries: int
    entries_written: int
    passes_recorded: int
    steps_per_entry: int
    skipped_passes: int
    skipped_recorded: int
    live_counts: bool
    moe_layers: tuple[int, ...]
    top_k: int | None
    expert_groups: int | None
    server_start: str | None  # a random id drawn when the worker started: which server start a bench run measured

    @classmethod
    def from_wire(cls, doc: Any, source: str | None = None, what: str = "status answer") -> WorkerStatus:
        return _read_fields(cls, _Fields(doc, what, source))

    def dump_meta(self) -> dict:
        """The status keys a dump file's metadata carries (``DUMP_META_KEYS``), as on the wire."""
        wire = self.to_wire()
        return {k: wire[k] for k in DUMP_META_KEYS}


@dataclass(frozen=True)
class RankView(_Answer):
    """One rank's entry under ``RANKS_KEY`` (``RANK_KEYS``, in order)."""

    ep_rank: int
    dp_rank: int
    tp_rank: int
    observer: str
    layout_hash: str | None
    redundant_slots: int
    dispatch: str | None
    entries_written: int
    passes_recorded: int
    skipped_passes: int
    skipped_recorded: int

    @classmethod
    def from_wire(cls, doc: Any, source: str | None = None, what: str = "rank") -> RankView:
        return _read_fields(cls, _Fields(doc, what, source))

    @classmethod
    def of(cls, status: WorkerStatus) -> RankView:
        """This rank's view in its full status."""
        return cls(**{k: getattr(status, k) for k in RANK_KEYS})


# What each worker reports; GET /scene_eplb/status answers EP rank 0's, plus RANKS_KEY and AGREE_KEY.
STATUS_KEYS = tuple(f.name for f in fields(WorkerStatus))
# Every rank's view, one entry per worker, under RANKS_KEY of the status answer.
RANK_KEYS = tuple(f.name for f in fields(RankView))


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


@dataclass(frozen=True)
class LiveTime(_Answer):
    """The live object's ``time`` (``measured.time_view``, stamped by ``fitness.LiveFitness``): ``rank_ms``
    [ranks][layers] mean local expert ms per pass, ``median`` / ``worst`` over layers of its max/mean
    over ranks (``per_layer``), ``moe_share`` of step time, ``step_ms`` the mean wall ms of a real step,
    ``rank_assignments`` [ranks][layers] (None: the window had no measured rank loads), the recent
    windows' ``sub_windows`` step ms, the server's ``provenance`` and ``gap_ms``, the mean busy pause
    between steps (None: none was timed), and ``rank_active_slots`` [ranks][layers] (None: not
    captured). ``advise`` reads it as a ``TimingWindow``."""

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
        )

    def window(self, where: str, layers: int | None, around: dict, record: bool = False) -> TimingWindow:
        """This window as ``advise`` prices it (``TimingWindow.checked``); ``around``: the status's
        provenance keys, where the window's own ``provenance`` does not say; ``record``: it is a
        record's own window."""
        f = _Fields({}, "timing", where, prefix="")
        if self.step_ms is None or self.rank_assignments is None:
            f.fail(f"has no {'step_ms' if self.step_ms is None else 'rank_assignments'}: the window saw no timed traffic")
        return TimingWindow.checked(
            f,
            _floats(self.rank_ms),
            _floats(self.rank_assignments),
            float(self.step_ms),
            self.moe_share,
            tuple(map(float, self.sub_windows)),
            {**around, **self.provenance},
            layers,
            record,
            self.gap_ms or 0.0,
            None if self.rank_active_slots is None else _floats(self.rank_active_slots),
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
    view under ``RANKS_KEY``, their agreement under ``AGREE_KEY`` and the live object under ``LIVE_KEY``."""

    status: WorkerStatus
    ranks: tuple[RankView, ...]
    ranks_agree: bool
    live: LiveAnswer | None

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
        return cls(
            WorkerStatus.from_wire(doc, source),
            tuple(RankView.from_wire(r, source, f"status answer's {RANKS_KEY}[{i}]") for i, r in enumerate(ranks)),
            f.flag(AGREE_KEY),
            None if live is None else LiveAnswer.from_wire(live, source),
        )

    def to_wire(self) -> dict:
        return {
            **self.status.to_wire(),
            RANKS_KEY: [r.to_wire() for r in self.ranks],
            AGREE_KEY: self.ranks_agree,
            LIVE_KEY: None if self.live is None else self.live.to_wire(),
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
class RankLive(_Answer):
    """A worker's answer to ``LIVE_ACTION``: its cumulative live counts [L_moe, E] (``counts``) and
    physical [L_moe, P] (MoE layers in order), the logical counts of the rows it routes itself
    (``own_counts`` [L_moe, E]: its static source rows), whether its counts count (``contributes``),
    ``source`` [base, span] of the static-table rows behind its batch, and with ``time_moe`` its MoE
    seconds per layer [L_moe] over ``moe_passes`` passes, its real ``steps``' seconds and the
    ``gap_seconds`` of its ``gaps`` busy pauses between steps."""

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

    @classmethod
    def from_wire(cls, doc: Any, source: str | None = None) -> RankLive:
        f = _Fields(doc, "live answer of a rank", source)
        layers = f.integers("moe_layers")
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
        )


@dataclass(frozen=True)
class RecordLive(_Answer):
    """A worker's answer to ``RECORD_LIVE_ACTION``: its cumulative live counts as the last record
    started and as it stopped, each read at that boundary, so their difference is exactly the
    passes the record counted (the poller's windows fall where they fall)."""

    start: RankLive
    stop: RankLive

    @classmethod
    def from_wire(cls, doc: Any, source: str | None = None) -> RecordLive:
        f = _Fields(doc, "record live answer", source)
        start, stop = (f.get(k, lambda v: isinstance(v, dict), "an object") for k in ("start", "stop"))
        return cls(RankLive.from_wire(start, source), RankLive.from_wire(stop, source))


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


# ================================================================ timing window
#
# The status answer's ``live.time`` object as ``advise`` reads it, checked where it is read: a
# timing window with NaN, a negative time or a step shorter than the MoE time in it is refused
# with the field named, never priced. Stdlib only, like the rest of this module.

# What a timing window says about the server it came from; a dump's metadata carries the same keys,
# and ``advise`` refuses to price a dump with the timing of another layout, geometry or role.
PROVENANCE_KEYS = ("layout_hash", "ep_size", "redundant_slots", "role", "dispatch", "steps_per_entry", "engine", "plugin_version")


def _provenance(said: dict, window: _Fields) -> dict:
    """Every one of ``PROVENANCE_KEYS`` from ``said`` (the window's own provenance over the status
    keys around it), each read as the status reads it; a key left out is refused with the window
    named: absent is not null (``layout_hash`` null is the linear layout, a value)."""
    missing = [k for k in PROVENANCE_KEYS if k not in said]
    if missing:
        window.fail(
            f"does not say its {', '.join(missing)} (provenance): a window must say which server, layout and role it "
            "came from, and a key left out is not read as null (the linear layout)"
        )
    f = _Fields(said, f"{window.what}'s provenance", window.source, window.prefix)
    return {k: _STATUS_FIELDS[k](f, k) for k in PROVENANCE_KEYS}


@dataclass(frozen=True)
class TimingWindow:
    """One live window's MoE timing over every rank: ``rank_ms`` [ranks][layers] local expert ms
    per pass and ``rank_assignments`` [ranks][layers] the assignments each rank computed per pass
    (the x of advise's count -> time model), ``step_ms`` the mean wall ms of a step, ``provenance``
    the server it came from (every one of ``PROVENANCE_KEYS``: a window that leaves one out is
    refused, never read as the linear layout; ``layout_hash`` None *is* the linear layout),
    ``moe_share`` its MoE part, ``sub_windows`` the step ms of the server's recent windows (their
    spread is a measured noise floor), ``record`` whether it is a record's own window
    (``live.record_time``: the passes of that record's dump) rather than a live window that falls
    where it falls, ``gap_ms`` the mean busy pause between steps (what a step's throughput pays
    beside the step; 0 where not timed), ``rank_active_slots`` [ranks][layers] the mean slots per
    pass each rank computed at least one assignment for (whose weights it read; None where the
    server does not capture them: the model then prices no cost per active slot)."""

    rank_ms: tuple[tuple[float, ...], ...]
    rank_assignments: tuple[tuple[float, ...], ...]
    step_ms: float
    provenance: dict
    moe_share: float | None = None
    sub_windows: tuple[float, ...] = ()
    record: bool = False
    gap_ms: float = 0.0
    rank_active_slots: tuple[tuple[float, ...], ...] | None = None

    @property
    def ranks(self) -> int:
        return len(self.rank_ms)

    @property
    def layers(self) -> int:
        return len(self.rank_ms[0])

    @classmethod
    def from_wire(cls, doc, where: str = "timing", layers: int | None = None, record: bool = False) -> TimingWindow:
        """The window from a ``live.time`` object (or a saved ``to_wire``), checked: finite
        non-negative ms, a positive ``step_ms`` at least the MoE ms a rank spends in it, ``moe_share``
        in [0, 1], ``rank_ms`` and ``rank_assignments`` of one shape (with ``layers`` MoE layers when
        given), its own ``provenance`` complete; ``record``: it is a record's own window (as the
        object's ``record`` flag, where it has one, may also say)."""
        f = _Fields(doc, "timing", where, prefix="")
        for key in ("rank_ms", "rank_assignments", "step_ms"):
            if doc.get(key) is None:
                f.fail(f"has no {key}: the window saw no timed traffic")
        rank_ms, assignments = (
            _floats(f.matrix(key, _non_negative, "a finite non-negative number") or ()) for key in ("rank_ms", "rank_assignments")
        )
        step_ms = float(f.number("step_ms", 0))
        share = f.number("moe_share", 0, 1, nullable=True) if "moe_share" in doc else None
        sub_windows = () if doc.get("sub_windows") is None else tuple(map(float, f.numbers("sub_windows", 0)))
        said = f.obj("provenance", "provenance", default=None)
        record = record or ("record" in doc and f.flag("record"))
        gap = f.number("gap_ms", 0, nullable=True) if "gap_ms" in doc else None
        known = {} if said is None else said.doc
        active = _active_slots(f)
        return cls.checked(
            f, rank_ms, assignments, step_ms, share, sub_windows, known, layers, record, gap or 0.0, active and _floats(active)
        )

    @classmethod
    def checked(
        cls,
        f: _Fields,
        rank_ms: tuple[tuple[float, ...], ...],
        assignments: tuple[tuple[float, ...], ...],
        step_ms: float,
        share: float | None,
        sub_windows: tuple[float, ...],
        provenance: dict,
        layers: int | None,
        record: bool = False,
        gap_ms: float = 0.0,
        active: tuple[tuple[float, ...], ...] | None = None,
    ) -> TimingWindow:
        """The window of fields each read (``from_wire``, ``LiveTime.window``), checked as a whole:
        ``rank_ms`` and ``rank_assignments`` of one shape (``layers`` MoE layers when given), a
        positive ``step_ms`` at least the MoE ms a rank spends in it, ``active`` (the active slots, where
        given) of the same shape and at most the assignments; ``f`` names the window in an error."""
        shape = (len(rank_ms), len(rank_ms[0]))
        if (len(assignments), len(assignments[0])) != shape:
            f.fail(
                f"rank_assignments is [{len(assignments)}][{len(assignments[0])}], rank_ms [{shape[0]}][{shape[1]}]: "
                "one value per rank and MoE layer in both"
            )
        if layers is not None and shape[1] != layers:
            f.fail(f"has {shape[1]} MoE layers, the candidate {layers}")
        if active is not None:
            if (len(active), len(active[0])) != shape:
                f.fail(
                    f"rank_active_slots is [{len(active)}][{len(active[0])}], rank_ms [{shape[0]}][{shape[1]}]: one value per rank and MoE layer in both"
                )
            over = [(r, i) for r, row in enumerate(active) for i, k in enumerate(row) if k > assignments[r][i] * (1 + 1e-9)]
            if over:
                r, i = over[0]
                f.fail(
                    f"rank_active_slots[{r}][{i}] is {active[r][i]:g}, more than the {assignments[r][i]:g} assignments the rank "
                    "computed: a slot is active when it computes at least one"
                )
        rank_moe = max(sum(row) for row in rank_ms)
        if step_ms <= 0 or step_ms < rank_moe * (1 - 1e-9):
            f.fail(f"step_ms {step_ms:g} is not positive or shorter than the {rank_moe:g} ms of MoE a rank spends in it")
        return cls(
            rank_ms,
            assignments,
            step_ms,
            _provenance(provenance, f),
            None if share is None else float(share),
            sub_windows,
            record,
            float(gap_ms),
            active,
        )

    @classmethod
    def of_status(cls, status: StatusAnswer, where: str, layers: int | None = None) -> TimingWindow | None:
        """The window of a status answer read off the wire (its last record's own window where it
        has one, else the live window), its provenance from the status around it; None where the
        server has no timed window yet."""
        live = status.live
        if live is None:
            return None
        record = live.record_time is not None
        time = live.record_time if record else live.time
        if time is None:
            return None
        return time.window(where, layers, {k: getattr(status.status, k) for k in PROVENANCE_KEYS}, record=record)

    @classmethod
    def from_status(cls, doc, where: str = "timing", layers: int | None = None) -> TimingWindow | None:
        """The window of a saved status answer (read and checked whole, as the status route's answer:
        ``of_status``), of its ``live`` object (the last record's own window, ``record_time``, where it
        has one, else ``time``) or of such a time object itself, which then says its own provenance;
        None where the server has no timed window yet."""
        if not isinstance(doc, dict):
            raise SceneEplbError("timing must be a JSON object (a status answer, its live object or live.time)", where)
        if LIVE_KEY in doc:
            return cls.of_status(StatusAnswer.from_wire(doc, where), where, layers)
        record = doc.get("record_time")
        timing = record if record is not None else doc.get("time", doc)
        return None if timing is None else cls.from_wire(timing, where, layers, record=record is not None)

    def to_wire(self) -> dict:
        return {
            "rank_ms": [list(r) for r in self.rank_ms],
            "rank_assignments": [list(r) for r in self.rank_assignments],
            "step_ms": self.step_ms,
            "provenance": dict(self.provenance),
            "moe_share": self.moe_share,
            "sub_windows": list(self.sub_windows),
            "record": self.record,
            "gap_ms": self.gap_ms,
            "rank_active_slots": None if self.rank_active_slots is None else [list(r) for r in self.rank_active_slots],
        }


# ================================================================ advice
#
# What ``advise`` answers, as ``scene-eplb advise --json`` prints it and the demo's summary.json
# holds it: the verdict, the predicted throughput ratio (null where the window pins no ratio
# down), the reasons in words and the numbers behind them (their keys depend on the path the
# verdict came by: none, the bound of an unidentified slope, or the whole model's figures).

VERDICTS = ("trial", "skip", "insufficient_evidence")


@dataclass(frozen=True)
class Advice:
    """The verdict (``VERDICTS``), ``predicted_throughput_ratio`` (candidate / running; None where
    not predicted), ``reasons`` in words, and ``details``: the figures behind them by name."""

    verdict: str
    predicted_throughput_ratio: float | None
    reasons: tuple[str, ...]
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict:
        return {
            "verdict": self.verdict,
            "predicted_throughput_ratio": self.predicted_throughput_ratio,
            "reasons": list(self.reasons),
            "details": dict(self.details),
        }

    @classmethod
    def from_wire(cls, doc: Any, source: str | None = None) -> Advice:
        """The advice from its JSON object, checked: a known verdict, a finite positive ratio or null,
        reasons as strings, details an object."""
        f = _Fields(doc, "advice", source, prefix="")
        return cls(
            f.text("verdict", choices=VERDICTS),
            f.get("predicted_throughput_ratio", lambda v: _is_number(v) and v > 0, "a finite number > 0", nullable=True),
            f._list("reasons", lambda v: isinstance(v, str), "strings", False, None) or (),
            f.get("details", lambda v: isinstance(v, dict), "an object"),
        )
