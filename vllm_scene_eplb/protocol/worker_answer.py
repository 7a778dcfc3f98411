"""The worker answer: one worker's answer to a control action as collective_rpc carries it,
around any of the payloads (a status, an export job, a dump start, live counts, the native load)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from .fields import _Fields


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
