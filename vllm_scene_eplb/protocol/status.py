"""A worker's status, every rank's view of it, and the startup line each worker logs of it."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from .fields import _Fields, _wire
from .routes import DUMP_META_KEYS, OBSERVER_IDLE, OBSERVER_OFF, OBSERVER_RECORDING

_LINE = (
    "scene-eplb: role={role} observer={observer} layout_hash={layout_hash} redundant_slots={redundant_slots} "
    "dispatch={dispatch} ep_size={ep_size} load_audit={load_audit} ({where})"
)
_LINE_RE = re.compile(
    r"scene-eplb: role=(\S+) observer=(\S+) layout_hash=(\S+)(?: \(linear\))? redundant_slots=(\d+) "
    r"dispatch=(\S+)(?: ep_size=\d+ load_audit=(\S+))?"
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
        load_audit=status.get("load_audit") or "none",
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
    load_audit: str | None = None  # absent from a line written before the load audit existed

    def to_wire(self) -> dict:
        return _wire(self)


def parse_startup_lines(text: str) -> list[StartupLine]:
    """Every startup line in a log, in order."""
    none = lambda v: None if v in ("", "none") else v  # noqa: E731
    return [StartupLine(m[0], m[1], none(m[2]), int(m[3]), none(m[4]), none(m[5])) for m in _LINE_RE.findall(text)]


# The line each vLLM-Ascend worker logs the first time a real (non-dummy) pass ran a MoE comm method
# (MC2, FUSED_MC2, ALLTOALL, ALLGATHER), and how verify.sh's mc2 check finds it in a server log.
COMM_METHOD_LINE = "scene-eplb: MoE comm method %s in a real pass"
COMM_METHOD_RE = re.compile(r"scene-eplb: MoE comm method (\w+) in a real pass")


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
    # a drafter's MoE layers, counted apart; absent in a status of a plugin that did not count them
    "drafter_layers": lambda f, k: f.integers(k) if k in f.doc else (),
    # the load audit's word (None: no audit ran); absent in a status saved before the audit existed
    "load_audit": lambda f, k: f.get(k, lambda v: isinstance(v, str), "a string", nullable=True, default=None),
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
    load_audit: str | None  # what the load audit checked on this worker (runtime.worker.load_audit), None: none ran
    drafter_layers: tuple[int, ...] = ()  # the speculative drafter's MoE layers, counted apart (``layouts.drafter``)

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
    load_audit: str | None

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
