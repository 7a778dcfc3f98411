"""The export and dump answers: a worker's export job (``ExportJobAnswer``), its answer to
``dump`` (``DumpStarted``) and the dump route's answer over every rank (``DumpAnswer``)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from .fields import _Fields
from .status import _Answer

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
