"""The routing observer: per-pass expert counts, a device ring buffer of them, and live counts.

``RoutingObserver`` is the composition the adapters bind, one part per concern:

- ``id_space.IdSpace``: what a count row holds (physical slots or logical experts) and its two views;
- ``pass_counts.PassCounts``: the pass buffers the traced capture fills in the forward (``capture``,
  ``capture_sources``, ``skip``: at most four fixed-shape device ops per MoE layer and pass, no host sync);
- ``count_ring.CountRing``: the step-stamped ring entries, their DP signature and the record's
  control (``start``, ``stop``, ``snapshot``);
- ``live_totals.LiveTotals``: the cumulative counts of every real pass (``live_counts``);
- ``skipped_passes.SkippedPasses``: the (layer, pass) pairs counted as nothing;
- ``moe_timing.MoeTiming``: with ``time_moe``, each MoE layer's expert time and the steps' wall time
  (on CPU with the run-queue wait beside it: ``run_queue.RunQueueWait``);
- ``slot_activity.SlotActivity``: with ``time_moe`` and ``local_slots``, the rank's active slots and
  its passes by size.

``end_step`` runs between forward passes on the host: it adds the pass to the live counts and,
while recording, to the ring entry of its global step, and clears it. Engine-neutral: the adapters
bind ``capture`` to their routers and ``end_step`` to their step boundary. ``NullObserver`` stands
in before the model is bound (state ``off``). The interfaces are in ``interfaces``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from ...errors import SceneEplbError
from ...protocol import OBSERVER_IDLE, OBSERVER_OFF, OBSERVER_RECORDING, PassTimes, RankPassGroups, pass_group
from .count_ring import CountRing, Record
from .id_space import IdSpace
from .interfaces import NullSteps, ObserverStatus
from .live_totals import LiveTotals, LiveTotalsSnapshot
from .moe_timing import MoeTiming
from .pass_counts import PassCounts
from .run_queue import RunQueueWait
from .skipped_passes import SkippedPasses
from .slot_activity import SlotActivity

if TYPE_CHECKING:
    from .device_timer import DeviceMoeTimer


class RoutingObserver:
    """Counts (token, top-k) assignments per MoE layer and expert (or slot) into step-stamped ring entries.

    ``slot_to_expert`` (optional) [L, P]: the logical expert of every physical slot; given, ``capture``
    takes slot ids and logical counts are derived. ``dp_size`` > 1 keeps a DP signature per entry;
    ``source_rows``: the own rows are counted apart too (``capture_sources``); ``live_counts=False``: no live totals (the plugin key of that name);
    ``local_slots`` [lo, hi): this rank's slots in the count row, where its counted rows are every row
    its experts compute: with ``time_moe`` its active slots and passes by size are kept (``SlotActivity``).
    """

    def __init__(
        self,
        num_moe_layers: int,
        num_experts: int,
        entries: int,
        device: torch.device | str = "cpu",
        slot_to_expert: torch.Tensor | None = None,
        time_moe: bool = False,
        live_counts: bool = True,
        steps_per_entry: int = 1,
        dp_size: int = 1,
        source_rows: bool = False,
        local_slots: tuple[int, int] | None = None,
    ):
        L, self.source_rows = num_moe_layers, source_rows
        self.space = IdSpace(L, num_experts, device, slot_to_expert)
        self.passes = PassCounts(L, self.space, device, source_rows)
        row = (L, self.space.width + 2)
        self.totals = LiveTotals(row, device, live_counts, source_rows)
        self.ring = CountRing(entries, row, device, steps_per_entry, dp_size, source_rows)
        self.skipped = SkippedPasses(L, device)
        cpu = torch.device(device).type == "cpu"
        self.timing = MoeTiming(L, time_moe, RunQueueWait() if time_moe and cpu else None, cpu)
        on = time_moe and live_counts
        self.activity = SlotActivity(L, local_slots, device) if on and local_slots is not None else None
        self._group = 0  # the pass-size group of the pass being run (``begin_step``'s tokens)

    # ------------------------------------------------------------ in the forward (traced)

    def capture(
        self, moe_idx: int, ids: torch.Tensor, padding_rows: torch.Tensor | None = None, own_rows: torch.Tensor | None = None
    ) -> None:
        """``PassCounts.capture``: one pass's ids [M, k] of MoE layer ``moe_idx``, traceable."""
        self.passes.capture(moe_idx, ids, padding_rows, own_rows)

    def capture_sources(self, moe_idx: int, ids: torch.Tensor, padding_rows: torch.Tensor | None = None) -> None:
        """``PassCounts.capture_sources``: the ids [m, k] of the rows this rank routes itself, traceable."""
        self.passes.capture_sources(moe_idx, ids, padding_rows)

    def skip(self, moe_idx: int) -> None:
        """``PassCounts.skip``: count nothing for MoE layer ``moe_idx`` in this pass, traceable, one op."""
        self.passes.skip(moe_idx)

    # ------------------------------------------------------------ at bind (host, before any graph)

    def reserve(self, ids: int) -> None:
        """``PassCounts.reserve``: the ones for up to ``ids`` (token, top-k) ids a pass."""
        self.passes.reserve(ids)

    def attach_device_timer(self, timer: DeviceMoeTimer) -> None:
        """``MoeTiming.attach_device_timer``: MoE time from device timestamps that graph replays keep."""
        self.timing.attach_device_timer(timer)

    # ------------------------------------------------------------ the step boundary (host)

    def begin_step(self, tokens: int = 0) -> None:
        """The engine starts a step (host) of ``tokens`` scheduled tokens: its wall time runs from here to ``end_step``."""
        self.ring.begin_step(tokens)
        self._group = pass_group(tokens)
        self.timing.begin_step()

    def add_moe_seconds(self, moe_idx: int, seconds: float) -> None:
        """This pass's local expert time of MoE layer ``moe_idx`` (host, called by the adapter's timer)."""
        self.timing.add_moe_seconds(moe_idx, seconds)

    def kernel_clock(self) -> float:
        """``MoeTiming.kernel_clock``: on CPU this thread's CPU time, the wall clock elsewhere."""
        return self.timing.kernel_clock()

    def discard_pass(self) -> None:
        """Drop what the pass buffer holds (host, between passes): a pass the engine runs outside its
        steps (a warm-up, ``skip_eplb``, under EPLB's ``suppress()``) never reaches the counts, and
        each step starts from a cleared buffer (the own rows' too). The ring, the live counts and the
        clock are untouched."""
        self.passes.clear()
        self.timing.discard_pass()

    def note_dp_tokens(self, tokens) -> None:
        """This step's tokens per DP rank (host; a list or a CPU tensor), as every DP engine agreed them for the step."""
        self.ring.note_dp_tokens(tokens)

    def end_step(self, is_dummy: bool = False) -> None:
        """Close one forward pass: add it to the live counts and, while recording, to its ring entry
        (a dummy pass adds nothing but still advances the ring); then clear it."""
        recording = self.ring.recording
        self.ring.end_step(self.passes, is_dummy)
        self.skipped.end_step(self.passes.counts[:, self.passes.skipped_col], is_dummy, recording)
        if not is_dummy:
            self.totals.add(self.passes)
            if self.activity is not None:
                self.activity.add(self.passes.counts, self._group)
        self.timing.end_step(is_dummy, self._group)
        self.passes.clear()
        self._group = 0

    # ------------------------------------------------------------ reads and control (host, between steps)

    def live_counts(self) -> LiveTotalsSnapshot | None:
        """The cumulative counts (and times) of every real pass so far, on CPU (between steps only);
        None when live counting is off."""
        live = self.totals.read(self.space, self.timing.read())
        if live is None:
            return None
        live = replace(live, wait_seconds=self.timing.run_queue_wait())
        if self.activity is None:
            return live
        active, passes, assignments, slots = self.activity.read()
        seconds = tuple(map(tuple, self.timing.group_moe_seconds()))
        groups = RankPassGroups(tuple(passes), seconds, tuple(map(tuple, assignments)), tuple(map(tuple, slots)))
        return replace(live, active_slots=active, groups=groups)

    def passes_since(self, first: int) -> PassTimes | None:
        """``MoeTiming.passes_since``: the logged passes' MoE ms from pass number ``first`` on."""
        return self.timing.passes_since(first)

    def start(self) -> None:
        """Start a new record: clear the ring and count every following pass."""
        self.ring.start()
        self.skipped.start_record()

    def stop(self) -> None:
        self.ring.stop()

    def snapshot(self) -> Record:
        """The record's ring entries in time order, on CPU; refuses while recording or before any record."""
        return self.ring.snapshot(self.space)

    def status(self) -> ObserverStatus:
        total, record = self.skipped.read()
        ring = self.ring
        state = OBSERVER_RECORDING if ring.recording else OBSERVER_IDLE
        return ObserverStatus(state, ring.entries, min(ring.entries_written, ring.entries), ring.passes_recorded, total, record)


class NullObserver(NullSteps):
    """The observer before the model is bound: counts nothing, refuses control."""

    def __init__(self, role: str, entries: int):
        self.role, self.entries = role, entries

    def _refuse(self) -> SceneEplbError:
        return SceneEplbError(f"the recorder is off on this server (role {self.role}): no model bound or no counts here")

    def start(self) -> None:
        raise self._refuse()

    def stop(self) -> None:
        raise self._refuse()

    def snapshot(self) -> Record:
        raise self._refuse()

    def live_counts(self) -> None:
        return None

    def passes_since(self, first: int) -> None:
        return None

    def status(self) -> ObserverStatus:
        return ObserverStatus(OBSERVER_OFF, self.entries, 0, 0)
