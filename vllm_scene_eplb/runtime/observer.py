"""The P-side routing observer: per-pass logical-expert counts in a device ring buffer [entries, L, E].

Each ring entry holds one forward pass's counts (the recorder's time axis, T in counts [T, L, E]);
an entry is not a physical expert slot. ``capture`` runs inside the model's forward (traced by
torch.compile): one fixed-shape ``scatter_add_`` into a per-pass buffer, no host sync, no Python
state that changes per step. ``end_step`` runs between forward passes on the host: it commits the
pass into the next ring entry while recording, and always clears the pass buffer. Engine-neutral:
the adapters bind ``capture`` to their routers and ``end_step`` to their step boundary.

Every real pass is also added to ``live``, a cumulative [L, E] count that never stops and never
syncs the host in the forward; live fitness reads it between steps every few seconds, on every
role. The recorder (the ring, start/stop/snapshot) exists on the prefill role only
(``records=False`` elsewhere: state ``off``). ``NullObserver`` stands in before the model is bound.
"""

from __future__ import annotations

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


class RoutingObserver:
    """Counts (token, top-k) assignments per MoE layer and logical expert, one ring entry per pass.

    ``padding_rows`` (optional) is a bool mask of at least the batch size, True for rows not to
    count (graph padding, another rank's tokens). Dummy passes are dropped by ``end_step(is_dummy=True)``.
    """

    def __init__(self, num_moe_layers: int, num_experts: int, entries: int, device: torch.device | str = "cpu",
                 records: bool = True, role: str = "prefill"):
        self.num_moe_layers, self.num_experts, self.entries = num_moe_layers, num_experts, entries
        self.records, self.role = records, role
        self.pass_counts = torch.zeros((num_moe_layers, num_experts), dtype=torch.int32, device=device)
        self.live = torch.zeros((num_moe_layers, num_experts), dtype=torch.int64, device=device)
        self.live_passes = 0
        self.ring = torch.zeros((entries if records else 0, num_moe_layers, num_experts), dtype=torch.int32, device=device)
        self.recording = False
        self.next_entry = 0
        self.passes_recorded = 0
        self.has_record = False

    def capture(self, moe_idx: int, topk_ids: torch.Tensor, padding_rows: torch.Tensor | None = None) -> None:
        """Add one pass's logical top-k ids [M, k] of MoE layer ``moe_idx``; traceable. Ids outside
        [0, E) (zero experts, shared-expert pseudo ids) are not routed experts and are not counted."""
        ids = topk_ids.reshape(topk_ids.shape[0], -1).to(torch.int64)
        counted = (ids >= 0) & (ids < self.num_experts)
        if padding_rows is not None:
            counted &= ~padding_rows[: ids.shape[0]].unsqueeze(1)
        self.pass_counts[moe_idx].scatter_add_(0, ids.clamp(0, self.num_experts - 1).flatten(),
                                               counted.to(torch.int32).flatten())

    def end_step(self, is_dummy: bool = False) -> None:
        """Close one forward pass: add it to the live counts and, while recording, commit it to the
        ring (dummy passes go nowhere); then clear it."""
        if not is_dummy:
            self.live.add_(self.pass_counts)
            self.live_passes += 1
            if self.recording:
                self.ring[self.next_entry].copy_(self.pass_counts)
                self.next_entry = (self.next_entry + 1) % self.entries
                self.passes_recorded += 1
        self.pass_counts.zero_()

    def live_counts(self) -> tuple[torch.Tensor, int]:
        """The cumulative counts of every real pass so far, on CPU [L, E], and how many passes (between steps only)."""
        return self.live.to("cpu"), self.live_passes

    def _recorder_off(self) -> None:
        if not self.records:
            raise SceneEplbError(f"the recorder is off on this server (role {self.role}); it runs on the prefill role only")

    def start(self) -> None:
        """Start a new record: clear the ring and count every following pass."""
        self._recorder_off()
        if self.recording:
            raise SceneEplbError("recording is already on: stop it (and dump) before starting again")
        self.ring.zero_()
        self.pass_counts.zero_()
        self.next_entry, self.passes_recorded = 0, 0
        self.recording, self.has_record = True, True

    def stop(self) -> None:
        self._recorder_off()
        if not self.recording:
            raise SceneEplbError("recording is not on: start it first")
        self.recording = False

    def snapshot(self) -> torch.Tensor:
        """The recorded ring [entries, L, E] (a view); refuses while recording or before any record."""
        self._recorder_off()
        if self.recording:
            raise SceneEplbError("recording is on: stop it before dumping")
        if not self.has_record:
            raise SceneEplbError("nothing recorded yet: start and stop a record before dumping")
        return self.ring

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

    def end_step(self, is_dummy: bool = False) -> None:
        pass

    def live_counts(self) -> None:
        return None

    def status(self) -> ObserverStatus:
        return ObserverStatus(OBSERVER_OFF, self.entries, 0, 0)
