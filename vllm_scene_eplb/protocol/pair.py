"""What ``pair-advise`` answers: per layout (on P, on D, on both) the predicted whole-system output
throughput ratio of the P/D pair with its interval and verdict, the side that binds, the reasons in
words, the model's assumptions as sentences and the figures behind them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .advice import VERDICTS
from .fields import _Fields, _is_number
from .status import _Answer

LOADS = ("closed", "open")  # a fixed concurrency (each client waits for its reply), or a request rate
# What binds the pair's throughput: P's prefill, D's decode, the KV handoff between them, the
# clients' own time between requests (closed loop), or the offered rate (open loop, below capacity).
BINDINGS = ("prefill", "decode", "handoff", "clients", "offered_load")
PAIR_LAYOUTS = ("p", "d", "both")


@dataclass(frozen=True)
class PairPrediction(_Answer):
    """One layout's prediction: ``layout`` (``PAIR_LAYOUTS``), the node ratios it was given (None:
    that node keeps its layout), the pair's predicted output throughput ratio (candidate / running)
    with its ``low`` / ``high`` interval, and the verdict (``trial`` when ``low`` clears the noise floor)."""

    layout: str
    node_ratio_p: float | None
    node_ratio_d: float | None
    ratio: float
    low: float
    high: float
    verdict: str

    @classmethod
    def from_wire(cls, doc: Any, source: str | None = None, what: str = "prediction") -> PairPrediction:
        f = _Fields(doc, what, source, prefix="")
        positive = (lambda v: _is_number(v) and v > 0, "a finite number > 0")
        pred = cls(
            f.text("layout", choices=PAIR_LAYOUTS),
            f.get("node_ratio_p", *positive, nullable=True),
            f.get("node_ratio_d", *positive, nullable=True),
            f.get("ratio", *positive),
            f.get("low", *positive),
            f.get("high", *positive),
            f.text("verdict", choices=VERDICTS),
        )
        if not pred.low <= pred.ratio <= pred.high:
            f.fail(f"has ratio {pred.ratio} outside its interval [{pred.low}, {pred.high}]")
        return pred


@dataclass(frozen=True)
class PairAdvice(_Answer):
    """The pair's advice: the overall verdict (``trial`` when one layout's is), the load's kind
    (``LOADS``), what binds (``BINDINGS``; None where the evidence gate refused), the predictions
    (none when refused), the reasons, the assumptions and ``details`` by name."""

    verdict: str
    load: str
    binding: str | None
    predictions: tuple[PairPrediction, ...]
    reasons: tuple[str, ...]
    assumptions: tuple[str, ...]
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict:
        return {**super().to_wire(), "details": dict(self.details)}

    @classmethod
    def from_wire(cls, doc: Any, source: str | None = None) -> PairAdvice:
        f = _Fields(doc, "pair advice", source, prefix="")
        preds = f._list("predictions", lambda v: isinstance(v, dict), "objects", False, None) or ()
        strings = (lambda v: isinstance(v, str), "strings", False, None)
        return cls(
            f.text("verdict", choices=VERDICTS),
            f.text("load", choices=LOADS),
            f.text("binding", nullable=True, choices=BINDINGS),
            tuple(PairPrediction.from_wire(p, source, f"pair advice's predictions[{i}]") for i, p in enumerate(preds)),
            f._list("reasons", *strings) or (),
            f._list("assumptions", *strings) or (),
            f.get("details", lambda v: isinstance(v, dict), "an object"),
        )
