"""Live fitness in the API server: with ``scene_eplb.live_counts`` on, a background task reads every
rank's cumulative live counts (``protocol.RankLiveAnswer``) each ``live_window_s``, sums the ranks that
count each token once, scores the window with the loaded layout and dispatch
(``fitness.LiveFitness``), logs the drift alarm's changes, sets the gauges on ``/metrics``
(``metrics``) and holds the status route's ``live`` object (``protocol.LiveAnswer``). When a record
stops it also takes that record's own window (``record``): every rank's counts as it started and
stopped, so the timing ``advise`` prices the dump with covers exactly the dump's passes, and the
ranks' logged passes, lined up into the MoE critical path pass by pass (``per_pass_critical``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from ...errors import SceneEplbError
from ...formats import GeometryHint, read_layout
from ...live.fitness import LiveFitness, LiveSample
from ...live.measured import RankGroups, RankTime, SourceTraffic, per_pass_critical
from ...protocol import LIVE_ACTION, PROVENANCE_KEYS, RECORD_LIVE_ACTION, LiveAnswer, RankLiveAnswer, RecordLive, StatusAnswer
from ..config import PluginConfig
from . import metrics
from .fanout import RouteError, WorkerFanout
from .node_flow import NodeFlow

logger = logging.getLogger("vllm.scene_eplb")
# The live call's deadline is its window, but never under this: on a loaded 2-core host a worker's answer
# between two steps can take over a second, and every window it missed would merge into the next.
LIVE_CALL_FLOOR_S = 10.0


class LivePoller:
    """The live-fitness poller of one API server: ``start`` its task; ``answer`` is the last window's
    live object (None before the first window)."""

    def __init__(self, fanout: WorkerFanout, config: PluginConfig):
        self.fanout, self.config = fanout, config
        self.live: LiveFitness | None = None
        self.answer: LiveAnswer | None = None
        self._task: asyncio.Task | None = None
        self.flow: NodeFlow | None = None  # the node's flow, given each window's busy time (set by the routes)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="scene-eplb-live")

    async def _loop(self) -> None:
        """A first sample at once, the start of the first window (the server is not listening yet:
        no request's steps can fall before it, where no window would ever hold them), then every
        window: read, score, alarm, publish. Never raises: a missed window is logged and skipped."""
        window = self.config.live_window_s
        while True:
            try:
                await self.window(window)
            except (RouteError, SceneEplbError) as exc:
                logger.warning("scene-eplb: live fitness window skipped: %s", exc)
            except Exception:  # noqa: BLE001 - the poller must outlive any one bad window
                logger.exception("scene-eplb: live fitness window failed")
            await asyncio.sleep(window)

    async def window(self, window: float) -> None:
        """One window: every rank's counts, scored, its alarm logged when it changes, published."""
        now = time.monotonic()  # the sample's time: when it was asked for (a step its answer waited on is in it)
        answers = await self.fanout.all_ok(LIVE_ACTION, RankLiveAnswer.from_wire, timeout=max(window, LIVE_CALL_FLOOR_S))
        sample = live_sample(answers)
        if self.live is None:
            self.live = await self._view(sample.logical.shape[1])
        line = self.live.observe(sample, now)
        if self.flow is not None and self.live.step_seconds is not None and self.live.window_seconds > 0:
            self.flow.observe_busy(now, self.live.step_seconds, self.live.window_seconds)
        if line:
            (logger.warning if self.live.alarm.drift else logger.info)("%s", line)
        self.answer = self._publish(self.live)
        metrics.publish(self.answer, self.config.live_per_layer_metrics)

    async def record(self, action: str) -> None:
        """After a record's ``start`` (its predecessor's window is dropped) or ``stop`` (its own
        window is taken). Never raises: the record itself stands, the status says ``record_time`` null."""
        try:
            window, critical = None, None
            if action == "stop":
                spans = await self.fanout.all_ok(RECORD_LIVE_ACTION, RecordLive.from_wire)
                window = live_sample([s.stop for s in spans]).since(live_sample([s.start for s in spans]))
                # ranks that ran different numbers of MoE passes in the record cannot be lined up by number
                if len({s.stop.moe_passes - s.start.moe_passes for s in spans}) == 1:
                    critical = per_pass_critical([s.passes for s in spans])
                if self.live is None:
                    self.live = await self._view(window.logical.shape[1])
            if self.live is not None:
                self.live.record(window, critical)
                self.answer = self._publish(self.live)
        except (RouteError, SceneEplbError) as exc:
            logger.warning("scene-eplb: the record's own timing window was not taken: %s", exc)
            if self.live is not None:
                self.live.record(None)
            if self.answer is not None:
                self.answer = replace(self.answer, record_time=None)

    async def _view(self, num_experts: int) -> LiveFitness:
        """The live view of what this server loaded (its layout, or the linear one), from rank 0's status."""
        st = StatusAnswer.of_ranks(await self.fanout.statuses()).status
        layout = None
        if st.layout_path:
            layout = read_layout(st.layout_path, GeometryHint(ep_size=st.ep_size, num_experts=num_experts))
        return LiveFitness.for_server(
            layout,
            num_experts,
            st.ep_size,
            st.dispatch,
            st.moe_layers,
            self.config.drift_margin,
            self.config.drift_windows,
            provenance={k: getattr(st, k) for k in PROVENANCE_KEYS},
            drafter_layers=st.drafter_layers,
        )

    @staticmethod
    def _publish(live: LiveFitness) -> LiveAnswer:
        """The live object the status serves, read back through its own reader as a client will read
        it: one that would not read back (a NaN) is refused here, and the last good one stays served."""
        return LiveAnswer.from_wire(live.to_wire(), "the live fitness of this server")


def live_sample(ranks: Sequence[RankLiveAnswer]) -> LiveSample:
    """One cumulative sample from every rank's live answer: counts of the ranks that count each token
    once (logical, physical where every such rank has them), the sources (every rank's counts of the
    rows it routes itself: the traffic of its EP rank's static table row), every rank's timing."""
    counting = sorted((a for a in ranks if a.contributes), key=lambda a: a.ep_rank)
    logical = np.sum([np.asarray(a.counts, dtype=np.int64) for a in counting], axis=0)
    physical = None
    if all(a.physical is not None for a in counting):
        physical = np.sum([np.asarray(a.physical, dtype=np.int64) for a in counting], axis=0)
    ranked = sorted(ranks, key=lambda a: a.ep_rank)
    sources: tuple[SourceTraffic, ...] = ()
    if all(a.own_counts is not None for a in ranked):
        sources = tuple(SourceTraffic(a.ep_rank, 1, np.asarray(a.own_counts, dtype=np.int64)) for a in ranked)
    times: tuple[RankTime, ...] = ()
    if all(a.moe_seconds is not None for a in ranked):
        times = tuple(
            RankTime(
                np.asarray(a.moe_seconds, dtype=np.float64),
                a.moe_passes,
                a.steps,
                a.step_seconds,
                a.step_moe_seconds,
                a.gap_seconds,
                a.gaps,
                a.wait_seconds,
                None if a.active_slots is None else np.asarray(a.active_slots, dtype=np.int64),
                None if a.groups is None else RankGroups.of(a.groups),
            )
            for a in ranked
        )
    drafter = None
    if counting and all(a.drafter_counts is not None for a in counting):
        drafter = np.sum([np.asarray(a.drafter_counts, dtype=np.int64) for a in counting], axis=0)
    return LiveSample(logical, sum(a.passes for a in counting), physical, sources, times, drafter)
