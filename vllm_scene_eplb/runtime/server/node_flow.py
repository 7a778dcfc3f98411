"""A node's flow in its API server (``protocol.FlowView``): one ``FlowStep`` per engine step, as the
engine's stat loggers receive it (the adapter reads vLLM's ``SchedulerStats`` / ``IterationStats``
into it), kept over the last ``window_s`` seconds and summed into rates, means and shares on demand.
Host-side, in the API server's event loop: nothing here touches the engine's step loop."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from ...protocol import FlowView


@dataclass(frozen=True)
class FlowStep:
    """What one engine step reported: the scheduler's counts after it (running, waiting, waiting on a
    remote KV pull), the prompt tokens it computed, the tokens it generated, the first-token times
    (seconds since arrival) of the requests whose first token it produced, and the requests it finished."""

    at: float  # monotonic seconds, when the API server received it
    running: int
    waiting: int
    kv_fetching: int
    prompt_computed: int = 0
    generated: int = 0
    first_token_s: tuple[float, ...] = ()
    finished: int = 0


@dataclass
class NodeFlow:
    """The last ``window_s`` seconds of one node's engine steps, every DP engine's pooled: rates are
    the node's totals, means and shares are per engine step (comparable with one engine's
    ``max_num_seqs``), ``waiting_now`` / ``running_now`` the last step's."""

    max_num_seqs: int
    window_s: float = 30.0
    steps: deque[FlowStep] = field(default_factory=deque)
    started: float = field(default_factory=time.monotonic)
    broken: str | None = None  # why the flow stopped (the adapter could not read a step), None while it runs
    busy: deque[tuple[float, float, float]] = field(default_factory=deque)  # live windows: (end, step s, wall s)

    def observe(self, step: FlowStep) -> None:
        self.steps.append(step)
        self._trim(step.at)

    def observe_busy(self, at: float, step_seconds: float, wall_seconds: float) -> None:
        """One live window ending ``at``: the ranks' mean step wall seconds in its ``wall_seconds``."""
        self.busy.append((at, step_seconds, wall_seconds))
        self._trim(at)

    def _trim(self, now: float) -> None:
        while self.steps and self.steps[0].at < now - self.window_s:
            self.steps.popleft()
        while self.busy and self.busy[0][0] < now - self.window_s:
            self.busy.popleft()

    def _busy_share(self, steps: list[FlowStep]) -> float | None:
        """Step seconds over wall seconds of the live windows that ended in the flow's window; None
        where none ended, or where the flow has steps and no ended window holds any of them: the
        window that timed them is still open (or its calls failed and it has not closed), and the
        ended ones, idle, would read 0 for a node that was busy."""
        wall = sum(w for _, _, w in self.busy)
        if wall <= 0:
            return None
        if steps and not any(end - seconds <= s.at <= end for s in steps for end, _, seconds in self.busy):
            return None
        return sum(b for _, b, _ in self.busy) / wall

    def view(self, now: float | None = None) -> FlowView:
        """The flow over the window ending ``now``: rates over the window's wall time (from the server's
        start while it is younger than ``window_s``); the busy share over the live windows that ended in
        it (``_busy_share``: None until one that holds the flow's steps has ended)."""
        now = time.monotonic() if now is None else now
        self._trim(now)
        steps = list(self.steps)
        busy_share = self._busy_share(steps)
        span = max(1e-9, min(self.window_s, now - self.started))
        n = len(steps)
        ttfts = [t for s in steps for t in s.first_token_s]
        short = [s.running < self.max_num_seqs and s.waiting == 0 and s.kv_fetching == 0 for s in steps]
        last = steps[-1] if steps else FlowStep(now, 0, 0, 0)
        return FlowView(
            window_s=round(span, 3),
            steps=n,
            prefill_completions_per_s=round(len(ttfts) / span, 4),
            prefilled_tokens_per_s=round(sum(s.prompt_computed for s in steps) / span, 3),
            generated_tokens_per_s=round(sum(s.generated for s in steps) / span, 3),
            finished_per_s=round(sum(s.finished for s in steps) / span, 4),
            waiting_mean=round(sum(s.waiting for s in steps) / n, 3) if n else 0.0,
            waiting_now=last.waiting,
            running_mean=round(sum(s.running for s in steps) / n, 3) if n else 0.0,
            running_now=last.running,
            max_num_seqs=self.max_num_seqs,
            kv_fetching_mean=round(sum(s.kv_fetching for s in steps) / n, 3) if n else 0.0,
            first_token_ms=round(1000.0 * sum(ttfts) / len(ttfts), 3) if ttfts else None,
            short_steps_share=round(sum(short) / n, 4) if n else None,
            busy_share=None if busy_share is None else round(min(1.0, max(0.0, busy_share)), 4),
        )
