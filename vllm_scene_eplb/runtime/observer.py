"""The P-side routing observer: per-pass logical-expert counts in a device ring buffer [entries, L, E].

Each ring entry holds one forward pass's counts (the recorder's time axis, T in counts [T, L, E]);
an entry is not a physical expert slot. ``capture`` runs inside the model's forward (traced by
torch.compile): one fixed-shape ``scatter_add_`` into a per-pass buffer, no host sync, no Python
state that changes per step. ``end_step`` runs between forward passes on the host: it commits the
pass into the next ring entry while recording, and always clears the pass buffer. Engine-neutral:
the adapters bind ``capture`` to their routers and ``end_step`` to their step boundary.

Where the adapter sees the physical slot each assignment was sent to (after the layout's logical
-> physical mapping), ``capture_physical`` counts those the same way, [L, P] per pass: the measured
replica traffic, in the ring beside the logical counts and in the live counts. Per layer and pass
the two count the same assignments, so their totals agree.

Every real pass is also added to ``live``, a cumulative [L, E] count that never stops and never
syncs the host in the forward; live fitness reads it between steps every few seconds, on every
role. The recorder (the ring, start/stop/snapshot) exists on the prefill role only
(``records=False`` elsewhere: state ``off``). ``NullObserver`` stands in before the model is bound.

With ``time_moe`` the adapter also reports each MoE layer's local expert time per pass
(``add_moe_seconds``, host wall clock around the rank's own expert computation) and the step's wall
time (``end_step``): cumulative per layer, read with the live counts. Off, nothing is timed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..errors import SceneEplbError
from ..protocol import OBSERVER_IDLE, OBSERVER_OFF, OBSERVER_RECORDING


@dataclass(frozen=True)
class ObserverStatus:
    """What the status route reports about the recorder."""

    state: str  # off | idle | recording
    ring_entries: int
    entries_written: int
    passes_recorded: int

    @property
    def recording(self) -> bool:
        return self.state == OBSERVER_RECORDING


@dataclass(frozen=True)
class LiveCounts:
    """A rank's cumulative live counts, read between steps: logical [L, E], physical [L, P] (None
    where the adapter does not see physical ids) and passes. With ``time_moe``: the seconds of each
    layer's local expert computation [L] over the ``moe_passes`` passes that ran it (dummy passes
    too: an idle DP engine's experts still compute its peers' tokens), and over the ``steps`` real
    steps, their wall time and the MoE seconds within it."""

    logical: torch.Tensor
    physical: torch.Tensor | None
    passes: int
    moe_seconds: list[float] | None
    moe_passes: int
    steps: int
    step_seconds: float
    step_moe_seconds: float


class RoutingObserver:
    """Counts (token, top-k) assignments per MoE layer and logical expert, one ring entry per pass.

    ``padding_rows`` (optional) is a bool mask of at least the batch size, True for rows not to
    count (graph padding, another rank's tokens). Dummy passes are dropped by ``end_step(is_dummy=True)``.
    ``num_physical`` (P) sizes the physical counts; None: the adapter captures none.
    """

    def __init__(self, num_moe_layers: int, num_experts: int, entries: int, device: torch.device | str = "cpu",
                 records: bool = True, role: str = "prefill", num_physical: int | None = None, time_moe: bool = False):
        self.num_moe_layers, self.num_experts, self.entries = num_moe_layers, num_experts, entries
        self.num_physical, self.time_moe = num_physical, time_moe
        self.records, self.role = records, role
        T, L, P = entries if records else 0, num_moe_layers, num_physical or 0
        self.pass_counts = torch.zeros((L, num_experts), dtype=torch.int32, device=device)
        self.live = torch.zeros((L, num_experts), dtype=torch.int64, device=device)
        self.ring = torch.zeros((T, L, num_experts), dtype=torch.int32, device=device)
        self.pass_physical = torch.zeros((L, P), dtype=torch.int32, device=device)
        self.live_physical = torch.zeros((L, P), dtype=torch.int64, device=device)
        self.ring_physical = torch.zeros((T if num_physical else 0, L, P), dtype=torch.int32, device=device)
        self.live_passes = 0
        self.recording = False
        self.next_entry = 0
        self.passes_recorded = 0
        self.has_record = False
        self.moe_seconds = [0.0] * L  # cumulative, host
        self.moe_passes, self.steps = 0, 0
        self.step_seconds, self.step_moe_seconds = 0.0, 0.0
        self._pass_seconds = [0.0] * L
        self._step_started: float | None = None

    @staticmethod
    def _count(buffer: torch.Tensor, width: int, ids: torch.Tensor, padding_rows: torch.Tensor | None) -> None:
        ids = ids.reshape(ids.shape[0], -1).to(torch.int64)
        counted = (ids >= 0) & (ids < width)
        if padding_rows is not None:
            counted &= ~padding_rows[: ids.shape[0]].unsqueeze(1)
        buffer.scatter_add_(0, ids.clamp(0, width - 1).flatten(), counted.to(torch.int32).flatten())

    def capture(self, moe_idx: int, topk_ids: torch.Tensor, padding_rows: torch.Tensor | None = None) -> None:
        """Add one pass's logical top-k ids [M, k] of MoE layer ``moe_idx``; traceable. Ids outside
        [0, E) (zero experts, shared-expert pseudo ids) are not routed experts and are not counted."""
        self._count(self.pass_counts[moe_idx], self.num_experts, topk_ids, padding_rows)

    def capture_physical(self, moe_idx: int, slot_ids: torch.Tensor, padding_rows: torch.Tensor | None = None) -> None:
        """Add one pass's physical slot ids [M, k] of MoE layer ``moe_idx`` (the same rows as ``capture``); traceable."""
        self._count(self.pass_physical[moe_idx], self.num_physical, slot_ids, padding_rows)

    def begin_step(self) -> None:
        """The engine starts a step (host): its wall time runs from here to ``end_step``."""
        if self.time_moe:
            self._step_started = time.perf_counter()

    def add_moe_seconds(self, moe_idx: int, seconds: float) -> None:
        """This pass's local expert time of MoE layer ``moe_idx`` (host, called by the adapter's timer)."""
        self._pass_seconds[moe_idx] += seconds

    def end_step(self, is_dummy: bool = False) -> None:
        """Close one forward pass: add it to the live counts and, while recording, commit it to the
        ring (dummy passes go nowhere); then clear it."""
        if not is_dummy:
            self.live.add_(self.pass_counts)
            self.live_physical.add_(self.pass_physical)
            self.live_passes += 1
            if self.recording:
                self.ring[self.next_entry].copy_(self.pass_counts)
                if self.num_physical:
                    self.ring_physical[self.next_entry].copy_(self.pass_physical)
                self.next_entry = (self.next_entry + 1) % self.entries
                self.passes_recorded += 1
        if self.time_moe:
            self._end_timing(is_dummy)
        self.pass_counts.zero_()
        self.pass_physical.zero_()

    def _end_timing(self, is_dummy: bool) -> None:
        """Add this pass's MoE seconds (a dummy pass's too) and, for a real step with a start, its wall time."""
        if any(self._pass_seconds):
            if not is_dummy and self._step_started is not None:
                self.step_seconds += time.perf_counter() - self._step_started
                self.step_moe_seconds += sum(self._pass_seconds)
                self.steps += 1
            self.moe_seconds = [a + b for a, b in zip(self.moe_seconds, self._pass_seconds)]
            self.moe_passes += 1
        self._pass_seconds = [0.0] * self.num_moe_layers
        self._step_started = None

    def live_counts(self) -> LiveCounts:
        """The cumulative counts (and times) of every real pass so far, on CPU (between steps only)."""
        return LiveCounts(self.live.to("cpu"), self.live_physical.to("cpu") if self.num_physical else None, self.live_passes,
                          list(self.moe_seconds) if self.time_moe else None, self.moe_passes, self.steps,
                          self.step_seconds, self.step_moe_seconds)

    def _recorder_off(self) -> None:
        if not self.records:
            raise SceneEplbError(f"the recorder is off on this server (role {self.role}); it runs on the prefill role only")

    def start(self) -> None:
        """Start a new record: clear the ring and count every following pass."""
        self._recorder_off()
        if self.recording:
            raise SceneEplbError("recording is already on: stop it (and dump) before starting again")
        self.ring.zero_()
        self.ring_physical.zero_()
        self.pass_counts.zero_()
        self.pass_physical.zero_()
        self.next_entry, self.passes_recorded = 0, 0
        self.recording, self.has_record = True, True

    def stop(self) -> None:
        self._recorder_off()
        if not self.recording:
            raise SceneEplbError("recording is not on: start it first")
        self.recording = False

    def snapshot(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The recorded rings (views): logical [entries, L, E] and physical [entries, L, P] (None
        without physical counts); refuses while recording or before any record."""
        self._recorder_off()
        if self.recording:
            raise SceneEplbError("recording is on: stop it before dumping")
        if not self.has_record:
            raise SceneEplbError("nothing recorded yet: start and stop a record before dumping")
        return self.ring, (self.ring_physical if self.num_physical else None)

    def status(self) -> ObserverStatus:
        if not self.records:
            return ObserverStatus(OBSERVER_OFF, self.entries, 0, 0)
        state = OBSERVER_RECORDING if self.recording else OBSERVER_IDLE
        return ObserverStatus(state, self.entries, min(self.passes_recorded, self.entries), self.passes_recorded)


class NullObserver:
    """The observer before the model is bound: counts nothing, refuses control."""

    def __init__(self, role: str, entries: int):
        self.role, self.entries = role, entries

    def _refuse(self, *args, **kwargs):
        raise SceneEplbError(f"the recorder is off on this server (role {self.role}); it runs on the prefill role only")

    start = stop = snapshot = _refuse

    def begin_step(self) -> None:
        pass

    def end_step(self, is_dummy: bool = False) -> None:
        pass

    def live_counts(self) -> None:
        return None

    def status(self) -> ObserverStatus:
        return ObserverStatus(OBSERVER_OFF, self.entries, 0, 0)
