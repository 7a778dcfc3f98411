"""Live layout fitness: how well the loaded layout balances the traffic a server serves now, against
what it was fitted to expect, and a drift alarm (pure numpy; the adapters feed it live counts).

- the expectation it judges against is ``layouts.expected``'s: ``meta[EXPECTED_KEY]``, which
  ``fit`` stores with ``expected_score``, and ``layer_scores`` per layer for any counts.
- ``DriftAlarm``: fires when the live median exceeds the expected median by more than ``margin``
  for ``windows`` consecutive windows (never without an expectation, never during warm-up), clears
  when a window comes back under it; each change is one log line that says what to do.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ..layouts.expected import EXPECTED_KEY, layer_scores
from ..layouts.layout import Geometry, Layout, linear_map
from ..layouts.score import rank_score
from ..protocol import DrafterLiveView, LiveAnswer, LiveTime, MeasuredView
from .measured import PerPassCritical, RankTime, SourceTraffic, fidelity, modelled_slot_counts, rank_loads, time_view

SUB_WINDOWS = 8  # how many recent windows' step ms live.time keeps for advise's noise floor


@dataclass
class DriftAlarm:
    """Consecutive-window drift detection against the layout's expected median score."""

    expected_median: float | None
    margin: float = 0.05  # fires above expected * (1 + margin)
    windows: int = 3  # consecutive windows over the line
    warmup_windows: int = 1  # first windows with traffic that never count
    drift: bool = False
    over: int = 0
    seen: int = 0
    events: list[str] = field(default_factory=list)

    @property
    def threshold(self) -> float | None:
        return None if self.expected_median is None else self.expected_median * (1 + self.margin)

    def update(self, live_median: float) -> str | None:
        """Take one window's live median; returns the log line of a state change, else None."""
        self.seen += 1
        if self.threshold is None or self.expected_median is None or self.seen <= self.warmup_windows:
            return None
        self.over = self.over + 1 if live_median > self.threshold else 0
        if not self.drift and self.over >= self.windows:
            self.drift = True
            return (
                f"scene-eplb: DRIFT: live median score {live_median:.4f} is above the layout's expected "
                f"{self.expected_median:.4f} by {100 * (live_median / self.expected_median - 1):.1f}% (margin "
                f"{100 * self.margin:.0f}%) for {self.over} windows: the traffic no longer matches the scene the "
                "layout was fitted to; record the new scene (scene-eplb record start/stop/dump on a P node) and refit"
            )
        if self.drift and self.over == 0:
            self.drift = False
            return (
                f"scene-eplb: drift cleared: live median score {live_median:.4f} is back within "
                f"{100 * self.margin:.0f}% of the expected {self.expected_median:.4f}"
            )
        return None


@dataclass(frozen=True)
class LiveSample:
    """What the poller read from every rank at one instant, cumulative since the ranks started:
    ``logical`` [L_moe, E] summed over the ranks that count each token once, with their passes;
    ``physical`` [L_moe, P] likewise (None where not captured); ``sources``: each counting rank's
    logical counts with the EP ranks that route them (empty where unknown); ``times``: every rank's
    MoE timing (empty without ``time_moe``); ``drafter`` [D, E]: a speculative drafter's MoE layers'
    counts, summed as ``logical`` (None without)."""

    logical: np.ndarray
    passes: int
    physical: np.ndarray | None = None
    sources: tuple[SourceTraffic, ...] = ()
    times: tuple[RankTime, ...] = ()
    drafter: np.ndarray | None = None

    def since(self, last: LiveSample | None) -> LiveSample:
        """The window from ``last`` to this sample: every field's difference (this sample itself
        without a ``last``; physical counts only when both have them; sources and times only when
        both list the same ranks)."""
        if last is None:
            return self
        physical = (
            None if self.physical is None or last.physical is None else np.asarray(self.physical) - np.asarray(last.physical)
        )
        sources = (
            tuple(
                SourceTraffic(a.base, a.span, np.asarray(a.counts) - np.asarray(b.counts))
                for a, b in zip(self.sources, last.sources)
            )
            if len(last.sources) == len(self.sources)
            else self.sources
        )
        times = tuple(a.since(b) for a, b in zip(self.times, last.times)) if len(last.times) == len(self.times) else self.times
        drafter = None if self.drafter is None or last.drafter is None else np.asarray(self.drafter) - np.asarray(last.drafter)
        return LiveSample(
            np.asarray(self.logical, dtype=np.int64) - np.asarray(last.logical),
            self.passes - last.passes,
            physical,
            sources,
            times,
            drafter,
        )


@dataclass
class LiveFitness:
    """The live view of one server: per window, the score that the loaded layout (the linear
    layout without one) and its dispatch algorithm give the counts routed since the last window,
    and what was measured beside it (``measured``: replica traffic and fidelity; time).

    ``observe`` takes cumulative samples (only ever growing) and works on the difference to the
    previous call, so several pollers never steal each other's windows.
    """

    layout: Layout | None
    geometry: Geometry
    dispatch: str
    moe_layers: tuple[int, ...]
    alarm: DriftAlarm
    expected_worst: float | None = None
    window_seconds: float = 0.0
    windows: int = 0
    passes: int = 0
    per_layer: np.ndarray | None = None
    measured: np.ndarray | None = None
    fidelity: float | None = None
    time: LiveTime | None = None
    record_time: LiveTime | None = None  # the last record's own window (``record``); None while one runs
    step_seconds: float | None = None  # the last window's step wall seconds, mean over ranks (None: not timed)
    provenance: dict = field(default_factory=dict)  # the server's PROVENANCE_KEYS, stamped on live.time
    drafter_layers: tuple[int, ...] = ()  # a speculative drafter's MoE layers, scored apart (``drafter``)
    drafter_per_layer: np.ndarray | None = None
    drafter_share: float | None = None  # the drafter's share of the last window's assignments
    _step_ms: list[float] = field(default_factory=list)  # recent windows' step ms: live.time's sub_windows
    _last: LiveSample | None = None
    _last_time: float | None = None

    @classmethod
    def for_server(
        cls,
        layout: Layout | None,
        num_experts: int,
        ep_size: int,
        dispatch: str | None,
        moe_layers: tuple[int, ...],
        margin: float,
        windows: int,
        provenance: dict | None = None,
        drafter_layers: tuple[int, ...] = (),
    ) -> LiveFitness:
        """The live view of a server running ``layout`` (None: the linear layout on ``ep_size`` ranks),
        with its drafter's MoE layers ``drafter_layers`` apart. The layout's expectation counts only if
        it was fitted for the dispatch the server runs."""
        expected = (layout.meta.get(EXPECTED_KEY) if layout is not None else None) or {}
        if expected.get("dispatch") != (dispatch or "dynamic"):
            expected = {}
        geometry = layout.geometry if layout is not None else Geometry(num_experts, (-num_experts) % ep_size, ep_size)
        return cls(
            layout,
            geometry,
            dispatch or "dynamic",
            tuple(moe_layers),
            DriftAlarm(expected.get("median"), margin, windows),
            expected.get("worst"),
            provenance=dict(provenance or {}),
            drafter_layers=tuple(drafter_layers),
        )

    def _rows(self, n: int) -> tuple[np.ndarray, np.ndarray | None]:
        """The map rows [n, P] of the MoE layers (linear without a layout) and their fitted static table."""
        if self.layout is None:
            return linear_map(self.geometry, n), None
        rows = list(self.layout.moe_layers)
        return self.layout.physical_to_logical_map[rows], self.layout.static_sources_at(rows)

    def observe(self, sample: LiveSample, now: float) -> str | None:
        """One window ending at ``now``; returns the alarm's log line when its state changes."""
        window = sample.since(self._last)
        self.window_seconds = 0.0 if self._last_time is None else now - self._last_time
        self._last, self._last_time = sample, now
        self.step_seconds = sum(r.step_seconds for r in window.times) / len(window.times) if window.times else None
        if window.logical.sum() <= 0:
            return None  # no traffic in this window: nothing to judge
        self.windows += 1
        self.passes = int(window.passes)
        self.per_layer = layer_scores(self.layout, window.logical, self.geometry, self.dispatch)
        self.measured, self.fidelity, time = self._measure(window)
        if time is not None and time.step_ms is not None:
            self._step_ms = [*self._step_ms, float(time.step_ms)][-SUB_WINDOWS:]
        self.time = self._stamped(time)
        if window.drafter is not None:
            drafter = np.asarray(window.drafter, dtype=np.int64)
            view = None if self.layout is None else self.layout.drafter_view()
            self.drafter_per_layer = layer_scores(view, drafter, self.geometry, self.dispatch)
            self.drafter_share = float(drafter.sum() / (drafter.sum() + window.logical.sum()))
        return self.alarm.update(float(np.median(self.per_layer)))

    def record(self, window: LiveSample | None, critical: PerPassCritical | None = None) -> None:
        """Take ``window``, the passes of a record from its start to its stop, as ``record_time``
        with its ``critical`` path measured pass by pass where the ranks logged its passes (None: a
        record started, the last one's window no longer describes what is recorded)."""
        time = None if window is None else self._stamped(self._measure(window)[2])
        if time is not None and critical is not None:
            time = replace(time, critical_ms=round(critical.ms, 4), critical_passes=critical.passes)
        self.record_time = time

    def _measure(self, window: LiveSample) -> tuple[np.ndarray | None, float | None, LiveTime | None]:
        """Measured score [L], fidelity and time of ``window``, where the ranks reported them."""
        measured = fid = loads = None
        if window.physical is not None:
            physical = np.asarray(window.physical, dtype=np.int64)
            p2l, static_sources = self._rows(len(physical))
            if physical.shape == p2l.shape:
                loads = rank_loads(physical, self.geometry.ep_size)
                measured = rank_score(loads)
                if window.sources:
                    modelled = modelled_slot_counts(p2l, self.geometry, self.dispatch, list(window.sources), static_sources)
                    fid = fidelity(physical, modelled, p2l, self.geometry.num_experts)
        return measured, fid, (time_view(list(window.times), loads) if window.times else None)

    def _stamped(self, time: LiveTime | None) -> LiveTime | None:
        """``time`` with the server's provenance and the step ms of the last ``SUB_WINDOWS`` windows,
        which ``advise`` reads as its measured noise."""
        if time is None:
            return None
        return replace(time, sub_windows=tuple(round(x, 4) for x in self._step_ms), provenance=dict(self.provenance))

    def answer(self) -> LiveAnswer:
        """The status route's ``live`` object."""
        pl, m = self.per_layer, self.measured
        return LiveAnswer(
            median=None if pl is None else float(np.median(pl)),
            worst=None if pl is None else float(pl.max()),
            expected_median=self.alarm.expected_median,
            expected_worst=self.expected_worst,
            drift=self.alarm.drift,
            passes=self.passes,
            window_seconds=round(self.window_seconds, 3),
            windows=self.windows,
            threshold=self.alarm.threshold,
            dispatch=self.dispatch,
            layers=tuple(self.moe_layers),
            per_layer=None if pl is None else tuple(round(float(x), 5) for x in pl),
            measured=None
            if m is None
            else MeasuredView(float(np.median(m)), float(m.max()), tuple(round(float(x), 5) for x in m)),
            fidelity=self.fidelity,
            time=self.time,
            record_time=self.record_time,
            drafter=self._drafter_view(),
        )

    def _drafter_view(self) -> DrafterLiveView | None:
        """The drafter's layers apart (None without a drafter): their last window's scores and share."""
        if not self.drafter_layers:
            return None
        d = self.drafter_per_layer
        return DrafterLiveView(
            self.drafter_layers,
            None if d is None else float(np.median(d)),
            None if d is None else float(d.max()),
            None if d is None else tuple(round(float(x), 5) for x in d),
            None if self.drafter_share is None else round(self.drafter_share, 5),
        )

    def to_wire(self) -> dict:
        """``answer()`` as its JSON object."""
        return self.answer().to_wire()
