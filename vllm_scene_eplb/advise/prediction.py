"""What the model predicts: the MoE critical path per pass of the running layout and the candidate,
and the throughput ratio over the step's cycle.

Per pass and layer the slowest rank's modelled ms; every layer waits for its slowest rank (a
barrier per layer, no overlap of layers), so their sum is the MoE critical path, and the step
changes by the difference. A busy engine's throughput pays for each step and for the pause before
the next one (``gap_ms``: scheduling, sampling, the API server's and the client's share of the
machine, measured between steps), which no layout changes, so the ratio is over their sum:

    predicted throughput ratio = cycle_ms / (cycle_ms - critical_now + critical_candidate)
    cycle_ms = step_ms + gap_ms

Pure numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..protocol import TimingWindow
from .model import TimeModel


def cycle_ms(timing: TimingWindow) -> float:
    """A busy step's cycle: the step and the pause before the next one (what each step's throughput pays)."""
    return timing.step_ms + timing.gap_ms


def throughput_ratio(cycle: float, critical_now: float, critical_candidate: float) -> float:
    """The candidate's throughput over the running layout's when only the MoE critical path changes."""
    return cycle / max(cycle - critical_now + critical_candidate, 1e-9)


@dataclass(frozen=True)
class Prediction:
    """The MoE critical path of every recorded pass now and with the candidate (``now`` / ``candidate``
    [n] ms), each pass's written entry (``origin`` [n]) and the cycle it is priced in."""

    now: np.ndarray
    candidate: np.ndarray
    origin: np.ndarray
    cycle: float

    @classmethod
    def of(
        cls,
        model: TimeModel,
        now: np.ndarray,
        candidate: np.ndarray,
        origin: np.ndarray,
        cycle: float,
        active: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> Prediction:
        """From per-pass rank loads [n, L, ranks] of the running layout and of the candidate, and
        their per-pass active slots per rank (``active``: now, candidate; None: not priced)."""
        act_now, act_cand = (None, None) if active is None else active
        return cls(model.critical(now, act_now), model.critical(candidate, act_cand), origin, cycle)

    @property
    def critical_now(self) -> float:
        return float(self.now.mean())

    @property
    def critical_candidate(self) -> float:
        return float(self.candidate.mean())

    @property
    def ratio(self) -> float:
        return throughput_ratio(self.cycle, self.critical_now, self.critical_candidate)

    def halves(self, n_entries: int) -> list[float]:
        """The ratio on the passes of the first and of the second half of the ``n_entries`` written entries."""
        first = self.origin < (n_entries + 1) // 2
        return [
            throughput_ratio(self.cycle, float(self.now[part].mean()), float(self.candidate[part].mean()))
            for part in (first, ~first)
        ]
