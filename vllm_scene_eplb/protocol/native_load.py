"""The native-load answers: a rank's engine counters (``NativeCounts``), a worker's answer to
``NATIVE_ACTION`` (``RankNativeLoad``) and the native_load route's sum over ranks (``NativeLoadAnswer``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .fields import _Fields
from .status import _Answer


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
