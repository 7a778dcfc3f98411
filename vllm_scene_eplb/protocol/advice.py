"""What ``advise`` answers: the verdict, the predicted ratio, the reasons and the figures behind them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .fields import _Fields, _is_number

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
