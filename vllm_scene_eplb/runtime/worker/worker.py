"""One worker's recorder state and its control actions, the same on every engine.

An engine adapter subclasses ``RecorderPlugin`` with what only it knows (how its MoE layers are
found and hooked, where its step boundary is), builds one per worker when the flag is on, and
routes the control RPC of its HTTP routes to ``control``. Control returns between steps at once,
never waits for a peer and never raises: the export of a dump runs on the ``Exporter``'s thread.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ... import __version__
from ...errors import SceneEplbError
from ...layouts.layout import Layout
from ...planning.model_geometry import ModelGeometry
from ...protocol import (
    EXPORT_STATUS_ACTION,
    LIVE_ACTION,
    NATIVE_ACTION,
    RECORD_LIVE_ACTION,
    DumpStarted,
    NativeCounts,
    PassTimes,
    RankLiveAnswer,
    RankNativeLoad,
    RecordLive,
    WorkerAnswer,
    WorkerStatus,
)
from ..config import PluginConfig
from .export import Exporter, RankRecord
from .interfaces import NullSteps, Observer
from .load_audit import LoadAudit
from .observer import RoutingObserver

if TYPE_CHECKING:
    from .count_ring import Record

NOT_ENABLED = "the scene_eplb plugin is not enabled on this server (no scene_eplb in --additional-config)"


class NullPlugin(NullSteps):
    """The plugin off on this worker: no step work, nothing bound, every control action refused."""

    def bind(self, model_runner) -> None:
        pass

    def control(self, action: str, *args) -> dict:
        return WorkerAnswer.refused(NOT_ENABLED, 404).to_wire()


@dataclass(kw_only=True)
class RecorderPlugin:
    """This worker's plugin state: settings, the loaded layout, the observer and where it counts."""

    config: PluginConfig
    role: str
    engine: str  # "vllm 0.32.0", "vllm-ascend 0.23.0.post1 (vllm 0.23.0)": what status reports
    model: ModelGeometry
    model_name: str
    ep_size: int
    ep_rank: int  # this worker's place in the engine's EP group (DP x TP, DP-major)
    dp_rank: int
    tp_rank: int
    contributes: bool  # False on ranks whose tokens another rank already counts
    observer: Observer  # a NullObserver until ``bind`` makes the RoutingObserver
    exporter: Exporter
    layout: Layout | None = None
    layout_path: str | None = None
    moe_layer_ids: list[int] = field(default_factory=list)
    # A speculative drafter's MoE layers (model layer ids after the target's) and their observer,
    # stepped with the target's (``bind_drafter``): counted apart, the same ring entries, one dump.
    drafter_layer_ids: list[int] = field(default_factory=list)
    drafter_observer: Observer | None = None
    # Drawn once per worker process: a new server start, a new id (bench records it per run).
    server_start: str = field(default_factory=lambda: uuid.uuid4().hex)
    load_audit: LoadAudit | None = None  # what the adapter's load audit checked (set when it binds)
    # The live counts as the last record started and stopped (None: live counts off, or not yet).
    record_live: tuple[RankLiveAnswer | None, RankLiveAnswer | None] = (None, None)
    record_passes: PassTimes | None = None  # the last record's passes' MoE ms (``MoeTiming.passes_since``)

    def status(self) -> WorkerStatus:
        """What the status route and the startup log line report (``protocol.STATUS_KEYS``)."""
        obs = self.observer.status()
        return WorkerStatus(
            plugin_version=__version__,
            engine=self.engine,
            model=self.model_name,
            role=self.role,
            ep_size=self.ep_size,
            ep_rank=self.ep_rank,
            dp_rank=self.dp_rank,
            tp_rank=self.tp_rank,
            layout_hash=self.layout.digest() if self.layout else None,
            layout_path=self.layout_path,
            redundant_slots=self.layout.geometry.num_redundant if self.layout else 0,
            dispatch=self.config.dispatch if self.layout else None,
            observer=obs.state,
            recording=obs.recording,
            ring_entries=obs.ring_entries,
            entries_written=obs.entries_written,
            passes_recorded=obs.passes_recorded,
            steps_per_entry=self.config.entry_steps(self.role),
            skipped_passes=obs.skipped_passes,
            skipped_recorded=obs.skipped_recorded,
            live_counts=self.config.live_counts,
            moe_layers=tuple(self.moe_layer_ids),
            **self.model.routing(),
            server_start=self.server_start,
            load_audit=None if self.load_audit is None else self.load_audit.summary(),
            drafter_layers=tuple(self.drafter_layer_ids),
        )

    def observers(self) -> tuple[Observer, ...]:
        """The observers stepped together: the target's, then the drafter's where it has one."""
        return (self.observer,) if self.drafter_observer is None else (self.observer, self.drafter_observer)

    def begin_step(self, tokens: int = 0) -> None:
        """The engine starts a step of ``tokens`` scheduled tokens (its wall time is timed with ``time_moe``)."""
        for obs in self.observers():
            obs.begin_step(tokens)

    def end_step(self, is_dummy: bool) -> None:
        """The engine's step boundary: commit the pass just run (a dummy pass only advances the ring)."""
        for obs in self.observers():
            obs.end_step(is_dummy)

    def add_moe_seconds(self, moe_idx: int, seconds: float) -> None:
        """This pass's local expert time of MoE layer ``moe_idx`` (``time_moe``: the adapter's timer)."""
        self.observer.add_moe_seconds(moe_idx, seconds)

    def kernel_clock(self) -> float:
        """The observer's kernel clock (``MoeTiming.kernel_clock``): the adapter's host timer."""
        return self.observer.kernel_clock()

    def discard_pass(self) -> None:
        """Drop the pass being counted (a warm-up or ``skip_eplb`` pass; before each step: a clean start)."""
        for obs in self.observers():
            obs.discard_pass()

    def note_dp_tokens(self, tokens) -> None:
        """This step's tokens per DP rank, as the DP engines agreed them (the ring's DP signature)."""
        for obs in self.observers():
            obs.note_dp_tokens(tokens)

    def check_moe_layers(self, found: list[int]) -> None:
        """Keep the MoE layer ids the engine built, refusing a model that disagrees with its config."""
        if tuple(found) != tuple(self.model.moe_layers):
            raise SceneEplbError(f"model built MoE layers {found}, its config says {list(self.model.moe_layers)}")
        self.moe_layer_ids = list(found)

    def bind_drafter(
        self, found: list[int], device, slot_to_expert=None, dp_size: int = 1, source_rows: bool = False
    ) -> RoutingObserver:
        """Keep the drafter's MoE layer ids (they must follow the target's layer axis, one after another)
        and make their observer: the target's settings, no timing (its time is not the target's step)."""
        first = self.model.num_layers
        if found != list(range(first, first + len(found))):
            raise SceneEplbError(
                f"the speculative drafter built MoE layers {found}: scene_eplb counts a drafter's layers as the rows "
                f"after the target's {first} layers, one after another ({first}, {first + 1}, ...)"
            )
        self.drafter_layer_ids = list(found)
        self.drafter_observer = RoutingObserver(
            len(found),
            self.model.num_experts,
            self.config.ring_entries,
            device,
            slot_to_expert=slot_to_expert,
            live_counts=self.config.live_counts,
            steps_per_entry=self.config.entry_steps(self.role),
            dp_size=dp_size,
            source_rows=source_rows,
        )
        return self.drafter_observer

    def make_observer(
        self, device, slot_to_expert=None, dp_size: int = 1, source_rows: bool = False, active_slots: bool = False
    ) -> RoutingObserver:
        """The observer of the bound model, on every role; ``slot_to_expert`` [L_moe, P]: the adapter
        captures physical slot ids (None: logical ids); ``dp_size`` > 1: it reports DP tokens per step;
        ``source_rows``: it also captures the rows it routes itself (``capture_sources``);
        ``active_slots``: the rows it counts are every row its experts compute (every rank routes the
        whole batch), so with ``time_moe`` its local slots' activity is kept (``local_slots``)."""
        self.observer = RoutingObserver(
            len(self.moe_layer_ids),
            self.model.num_experts,
            self.config.ring_entries,
            device,
            slot_to_expert=slot_to_expert,
            time_moe=self.config.time_moe,
            live_counts=self.config.live_counts,
            steps_per_entry=self.config.entry_steps(self.role),
            dp_size=dp_size,
            source_rows=source_rows,
            local_slots=self.local_slots(slot_to_expert) if active_slots else None,
        )
        return self.observer

    def local_slots(self, slot_to_expert) -> tuple[int, int] | None:
        """[lo, hi): this rank's physical slots (rank r holds [r * S, (r + 1) * S)); None where the
        observer counts logical ids or the slots do not split evenly over the EP ranks."""
        if slot_to_expert is None or slot_to_expert.shape[1] % self.ep_size:
            return None
        per_rank = slot_to_expert.shape[1] // self.ep_size
        return self.ep_rank * per_rank, (self.ep_rank + 1) * per_rank

    # ------------------------------------------------------------ control (the engine's worker RPC)

    def control(self, action: str, *args) -> dict:
        """``answer`` as collective_rpc carries it to the API server (``WorkerAnswer.to_wire``: a plain dict)."""
        return self.answer(action, *args).to_wire()

    def answer(self, action: str, *args) -> WorkerAnswer:
        """start | stop | dump EXPORT_ID DEADLINE | export_status EXPORT_ID | live | record_live |
        native_load | status. A refusal comes back as the answer's error (409), never raised."""
        try:
            if action == "start":
                for obs in self.observers():
                    obs.start()
                self.record_live = (self._live_now(), None)
            elif action == "stop":
                for obs in self.observers():
                    obs.stop()
                start = self.record_live[0]
                self.record_live = (start, self._live_now())
                self.record_passes = None if start is None else self.observer.passes_since(start.moe_passes)
            elif action == "dump":
                return WorkerAnswer(self._begin_dump(*args))
            elif action == EXPORT_STATUS_ACTION:
                return WorkerAnswer(self.exporter.job(*args).answer())
            elif action == LIVE_ACTION:
                return WorkerAnswer(self._live())
            elif action == RECORD_LIVE_ACTION:
                return WorkerAnswer(self._record_live())
            elif action == NATIVE_ACTION:
                return WorkerAnswer(RankNativeLoad(self.ep_rank, tuple(self.moe_layer_ids), self.native_load()))
            elif action != "status":
                raise SceneEplbError(f"unknown action {action!r}")
            return WorkerAnswer(self.status())
        except (SceneEplbError, TypeError) as exc:
            return WorkerAnswer.refused(str(exc))

    def native_load(self) -> NativeCounts:
        """The engine's own expert-load counters over the last record, in logical ids (``counts``
        [L_moe, E] or the ``reason`` there are none); engines whose counters the plugin does not read say so."""
        return NativeCounts(
            False,
            reason=f"{self.engine}: the plugin reads the engine's own load counters on vLLM-Ascend with dynamic EPLB only",
        )

    def _live(self) -> RankLiveAnswer:
        """This rank's cumulative live counts (``protocol.RankLiveAnswer``)."""
        live = self.observer.live_counts()
        if live is None:
            raise SceneEplbError("no live counts on this server (live_counts is off, or the model is not bound yet)")
        source = self.source_ranks()
        return RankLiveAnswer(
            counts=_rows(live.logical),
            physical=None if live.physical is None else _rows(live.physical),
            own_counts=None if live.own is None else _rows(live.own),
            passes=int(live.passes),
            moe_seconds=None if live.moe_seconds is None else tuple(map(float, live.moe_seconds)),
            moe_passes=int(live.moe_passes),
            steps=int(live.steps),
            step_seconds=float(live.step_seconds),
            step_moe_seconds=float(live.step_moe_seconds),
            gap_seconds=float(live.gap_seconds),
            gaps=int(live.gaps),
            contributes=self.contributes,
            ep_rank=self.ep_rank,
            source=None if source is None else tuple(source),
            moe_layers=tuple(self.moe_layer_ids),
            active_slots=None if live.active_slots is None else tuple(map(int, live.active_slots)),
            groups=live.groups,
            wait_seconds=None if live.wait_seconds is None else float(live.wait_seconds),
            **self._drafter_live(),
        )

    def _drafter_live(self) -> dict:
        """The drafter's layers and cumulative live counts for the rank's live answer (none without a
        drafter observer or its live counts)."""
        live = None if self.drafter_observer is None else self.drafter_observer.live_counts()
        if live is None:
            return {}
        return {"drafter_layers": tuple(self.drafter_layer_ids), "drafter_counts": _rows(live.logical)}

    def _live_now(self) -> RankLiveAnswer | None:
        """``_live`` where live counts are on; None where they are off."""
        return self._live() if self.config.live_counts else None

    def _record_live(self) -> RecordLive:
        """The live counts at the last record's start and stop; refused before a record has stopped."""
        start, stop = self.record_live
        if start is None or stop is None:
            why = "live_counts is off" if not self.config.live_counts else "no record has started and stopped yet"
            raise SceneEplbError(f"no record window on this rank: {why}")
        return RecordLive(start, stop, self.record_passes)

    def source_ranks(self) -> list[int] | None:
        """[base, span]: the EP ranks whose static-table rows route this rank's batch, split evenly
        over its rows (``replica_map.SourceRanks``); None where the adapter does not say."""
        return None

    def _begin_dump(self, export_id: str, deadline: float, skipped: int = 0) -> DumpStarted:
        """Freeze this rank's counts (a CPU copy) and hand them to the exporter's thread, which must
        finish by ``deadline`` (wall clock); a request that arrives after it starts nothing. ``skipped``:
        the record's skipped (layer, pass) pairs over all ranks (the route summed them), for the metadata."""
        if time.time() >= deadline:
            raise SceneEplbError(f"dump {export_id} reached this rank after its deadline: nothing started")
        rec = self.observer.snapshot()  # raises while recording / before any record, the same on every rank
        drafter = None if self.drafter_observer is None else self.drafter_observer.snapshot()
        T, L, E = self.config.ring_entries, self.num_rows(), self.model.num_experts
        P = 0 if rec.physical is None else rec.physical.shape[2]
        record = self.rank_record(rec, drafter)
        local = record.counts
        st = self.status()
        meta = st.dump_meta()
        meta.update(ring_wrapped=rec.wrapped, recorded_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"), skipped_passes=int(skipped))
        path = Path(self.config.dump_dir) / f"counts-{self.role}-{export_id}.npz"
        job = self.exporter.begin(export_id, record, path, meta, T, (L, E + P), deadline, split=E)
        return DumpStarted(
            **asdict(job.answer()),
            ep_rank=self.ep_rank,
            shape=(T, L, E),
            physical_shape=(T, L, P) if P else None,
            entries_written=st.entries_written,
            passes_recorded=st.passes_recorded,
            local_total=int(local[..., :E].sum()),
        )

    def num_rows(self) -> int:
        """The dump's layer axis: the model's layers, then the drafter's MoE layers."""
        return self.model.num_layers + len(self.drafter_layer_ids)

    def rank_record(self, rec: Record, drafter: Record | None = None) -> RankRecord:
        """This rank's part of an export, from its snapshot ``rec`` (and the drafter's, ``drafter``,
        the same ring entries): its entries [n, L, E + P] (logical then physical, summed in one
        export; the drafter's layers in their rows after the model's) where it contributes, else
        zeros; its own-row counts (every rank routes its own rows, contributing or not); the
        scheduled tokens on TP rank 0 alone (a DP rank's TP ranks run the same scheduled tokens,
        whichever of them count rows)."""
        import torch

        L, E = self.num_rows(), self.model.num_experts
        P = 0 if rec.physical is None else rec.physical.shape[2]
        local = torch.zeros((rec.stamps.size, L, E + P), dtype=torch.int64)
        sources = None if rec.sources is None else torch.zeros((rec.stamps.size, L, E), dtype=torch.int64)
        parts = [(self.moe_layer_ids, rec)]
        if drafter is not None:
            if not np.array_equal(drafter.stamps, rec.stamps):
                raise SceneEplbError("the drafter's ring entries are not the target's steps: nothing written")
            parts.append((self.drafter_layer_ids, drafter))
        for rows, part in parts:
            if sources is not None and part.sources is not None:
                sources[:, rows] = part.sources
            if self.contributes:
                local[:, rows, :E] = part.logical
                if part.physical is not None:
                    local[:, rows, E:] = part.physical
        tokens = rec.tokens if self.tp_rank == 0 else 0
        return RankRecord(local, rec.stamps, rec.signature, rec.passes, rec.steps_per_entry, tokens, sources)


def _rows(counts) -> tuple[tuple[int, ...], ...]:
    """Counts [L, W] (a CPU tensor) as the wire's rows of Python ints."""
    return tuple(map(tuple, counts.tolist()))
