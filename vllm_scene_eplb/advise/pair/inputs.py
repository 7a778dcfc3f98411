"""The pair's inputs: each node's window from its status answer (``NodeWindow``), the bench's load
(``PairLoad``) and a candidate's effect on one node (``NodeEffect``). Pure numpy."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ...errors import SceneEplbError
from ...protocol import Advice, FlowView, StatusAnswer
from ...protocol.fields import _is_number


@dataclass(frozen=True)
class NodeWindow:
    """One node's window from its status answer: its ``flow``, DP ``engines`` and the live window's
    mean ``step_ms`` and ``gap_ms`` (None: not timed)."""

    flow: FlowView
    engines: int
    step_ms: float | None
    gap_ms: float | None

    @classmethod
    def of(cls, status: StatusAnswer, side: str, source: str | None) -> NodeWindow:
        """The window of the ``side`` ("P" or "D") node, refused with one line naming what is missing."""
        wrong = "decode" if side == "P" else "prefill"
        if status.status.role == wrong:
            raise SceneEplbError(f"the {side} node's status says role={wrong}: is it the other node?", source)
        flow = status.flow
        if flow is None:
            raise SceneEplbError(
                f"the {side} node's status has no flow (vLLM's stats off, or a plugin older than this client): "
                "start it with stats on (no --disable-log-stats) and take its status during the bench",
                source,
            )
        if flow.steps == 0:
            raise SceneEplbError(f"the {side} node's flow saw no engine step in its {flow.window_s:g} s window", source)
        time = None if status.live is None else status.live.time
        step, gap = (None, None) if time is None else (time.step_ms, time.gap_ms)
        return cls(flow, len({r.dp_rank for r in status.ranks}), step, gap)

    @property
    def cycle_s(self) -> float | None:
        """A busy step's cycle (step and the pause before the next) in seconds, None when not timed."""
        return None if not self.step_ms else (self.step_ms + (self.gap_ms or 0.0)) / 1000.0


@dataclass(frozen=True)
class PairLoad:
    """The bench's load: per successful request [n] its time to first token and latency (s) and its
    output tokens; the measured throughput (requests/s, over the steady window where one exists),
    the concurrency cap (None: none) and the request rate (inf: all at once)."""

    ttft_s: np.ndarray
    latency_s: np.ndarray
    output_lens: np.ndarray
    throughput: float
    concurrency: int | None
    rate: float

    @property
    def closed(self) -> bool:
        return math.isinf(self.rate)

    @property
    def clients(self) -> int:
        """The closed loop's population: the cap, at most the requests sent (all of them without a cap)."""
        n = len(self.output_lens)
        return n if self.concurrency is None else min(self.concurrency, n)

    def tau(self) -> float:
        """Seconds per output token after the first, token-weighted over the requests."""
        many = self.output_lens >= 2
        return float((self.latency_s - self.ttft_s)[many].sum() / (self.output_lens[many] - 1).sum())

    def resampled(self, rng: np.random.Generator) -> PairLoad:
        """The load's requests drawn with replacement; a closed loop's throughput scaled by the mean
        latency's change (C / X = latency + the clients' time, which stays)."""
        idx = rng.integers(0, len(self.output_lens), len(self.output_lens))
        lat = self.latency_s[idx]
        if (self.output_lens[idx] < 2).all():
            idx, lat = np.arange(len(self.output_lens)), self.latency_s
        x = self.throughput
        if self.closed:
            cycle = self.clients / x
            x = self.clients / max(1e-12, cycle - float(self.latency_s.mean()) + float(lat.mean()))
        return replace(self, ttft_s=self.ttft_s[idx], latency_s=lat, output_lens=self.output_lens[idx], throughput=x)


@dataclass(frozen=True)
class NodeEffect:
    """A candidate's effect on one node: its throughput ratio over a busy cycle (candidate / running,
    > 1 faster) with an interval, and where it came from."""

    ratio: float
    low: float
    high: float
    source: str

    def __post_init__(self) -> None:
        if not (0 < self.low <= self.ratio <= self.high < math.inf):
            raise SceneEplbError(
                f"{self.source}: the node ratio {self.ratio} must lie in its interval [{self.low}, {self.high}], all > 0"
            )

    @classmethod
    def of_step_ratio(cls, ratio: float, low: float, high: float, node: NodeWindow, source: str) -> NodeEffect:
        """A plain step-time ratio (old step / new step) as a cycle ratio: the pause between steps,
        which no layout changes, stays (without a timed step the step is the whole cycle)."""
        if not node.step_ms:
            return cls(ratio, low, high, f"{source} (no timed step: taken as the whole cycle)")
        step, gap = node.step_ms, node.gap_ms or 0.0

        def cycle(r: float) -> float:
            return (step + gap) / (step / r + gap)

        return cls(cycle(ratio), cycle(low), cycle(high), f"{source} (step {step:.2f} ms + pause {gap:.2f} ms)")

    @classmethod
    def of_advice(cls, advice: Advice, source: str) -> NodeEffect:
        """A node's ``advise`` answer: its predicted ratio, the interval its own figures span (the
        ratio on each half of the recording, and at the other end of an unidentified slot cost)."""
        if advice.verdict == "insufficient_evidence" or advice.predicted_throughput_ratio is None:
            raise SceneEplbError(f"the advice is {advice.verdict}: it pins no node ratio down", source)
        ratio = advice.predicted_throughput_ratio
        halves = advice.details.get("halves", [])
        bound = advice.details.get("bound_ratio")
        spread = [ratio, *(halves if isinstance(halves, list) else [None]), *([] if bound is None else [bound])]
        if not all(_is_number(v, 1e-9) for v in spread):
            raise SceneEplbError("the advice's details halves and bound_ratio must be finite numbers > 0", source)
        return cls(ratio, min(spread), max(spread), f"{source} (advise: {advice.verdict})")

    def draw(self, rng: np.random.Generator) -> float:
        return float(rng.uniform(self.low, self.high)) if self.high > self.low else self.ratio
