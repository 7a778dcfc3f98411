"""The status route's answer (``StatusAnswer``, also what start and stop answer): EP rank 0's
status, every rank's view and their agreement, the live object and the node's flow."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .fields import _Fields
from .flow import FLOW_KEY, FlowView
from .live import LiveAnswer
from .routes import AGREE_KEY, AGREEMENT_KEYS, LIVE_KEY, RANKS_KEY
from .status import RankView, WorkerStatus, _Answer


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
