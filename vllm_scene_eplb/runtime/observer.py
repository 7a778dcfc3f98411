"""The routing observer: per-pass expert counts, a device ring buffer of them, and live counts.

Glossary:
- **global step**: this engine's forward passes since the model was bound, real and dummy alike.
  DP engines run their passes in lockstep (an idle engine runs a dummy pass whenever a peer has
  work, for the MoE collectives), so step s is the same moment on every engine;
- **ring entry**: ``steps_per_entry`` consecutive global steps summed; entry k holds steps
  [k * steps_per_entry, (k + 1) * steps_per_entry), its *stamp* is k. Entries are the recorder's
  time axis (T in counts [T, L, E]), not physical expert slots. Dummy passes advance the ring (with
  zeros), so entry k means the same steps on every DP engine and an export lines ranks up by stamp;
- **DP signature**: where the adapter reports each step's tokens per DP rank (``note_dp_tokens``,
  the same vector on every engine for the same step), their sum per entry; an export compares the
  engines' signatures of each entry, so entries that do not line up fail the dump.

``capture`` runs inside the model's forward (traced by torch.compile or recorded into a device
graph): at most four fixed-shape device ops per MoE layer and pass, no host sync, no Python state
that changes per step. ``end_step`` runs between forward passes on the host: it adds the pass to
the live counts and, while recording, to the ring entry of its global step, and clears it. Engine-neutral: the adapters bind ``capture`` to their routers and
``end_step`` to their step boundary.

What ``capture`` counts is the id space the adapter sees:

- physical slot ids [M, k] (after the layout's logical -> physical mapping), when the observer is
  given ``slot_to_expert`` [L, P]: the measured replica traffic. Logical counts [L, E] are derived
  from them (a slot serves one expert), when read, not per layer: one count, two views;
- logical expert ids [M, k] otherwise (no physical view).

A pass buffer row holds the W counts of the id space, one column for ids not counted (padding
rows, ids outside [0, W): zero experts, shared-expert pseudo ids) and one for the MoE layer's
skipped passes: an adapter that cannot tell which rows are this rank's (``skip``) counts nothing
for that layer and pass, and says so in status and in the dump.

**Own rows** (the static table's source rows): the rows whose replica choice this rank's own static
table row makes, the rows it routes itself. Where the counted rows are not all its own (TP ranks that
all route the same batch, split evenly over them: ``source_rows=True``), the adapter also hands them
(a slice of the pass's rows) to ``capture_sources``, which counts them into buffers of their own
(pass, ring, live), at most four more device ops; elsewhere the counted rows are the own rows and nothing more runs. Read as
``Record.sources`` / ``LiveCounts.own``: logical counts of the own rows.

``live`` (cumulative, never stops, never syncs the host in the forward) feeds live fitness; a
server can turn it off (``live=False``: decode nodes, whose steps are many and small). The recorder
(ring, start/stop/snapshot) runs on every role, prefill and decode. ``NullObserver`` stands in
before the model is bound (state ``off``).

With ``time_moe`` the adapter also reports each MoE layer's local expert time per pass
(``add_moe_seconds``, host wall clock around the rank's own expert computation; on CUDA an attached
``device_timer`` instead, whose accumulators graph replays keep) and the step's wall time
(``end_step``): cumulative per layer, read with the live counts. Off, nothing is timed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import SceneEplbError
from ..protocol import OBSERVER_IDLE, OBSERVER_OFF, OBSERVER_RECORDING


@dataclass(frozen=True)
class ObserverStatus:
    """What the status route reports about the recorder."""

    state: str  # off | idle | recording
    ring_entries: int
    entries_written: int  # ring entries of the current or last record still in the ring
    passes_recorded: int  # real passes of that record (dummy passes advance the ring, count nothing)
    skipped_passes: int = 0  # (MoE layer, pass) pairs counted as nothing since bind (rows not attributable)
    skipped_recorded: int = 0  # the same, in the current or last record

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
    own: torch.Tensor | None = None  # logical [L, E] of this rank's own rows (the static table's source rows)


@dataclass(frozen=True)
class Record:
    """A stopped record's ring entries in time order, on CPU: logical [n, L, E], physical [n, L, P]
    (None without physical counts), each entry's stamp [n] and DP signature [n, DP] (None: not reported)."""

    logical: torch.Tensor
    physical: torch.Tensor | None
    stamps: np.ndarray
    signature: np.ndarray | None
    steps_per_entry: int
    passes: int
    tokens: int  # the engine's scheduled tokens of the recorded passes (what its model ran, drafts included)
    wrapped: bool  # the record opened more entries than the ring holds: the oldest were overwritten
    sources: torch.Tensor | None = None  # logical [n, L, E] of this rank's own rows per entry


class RoutingObserver:
    """Counts (token, top-k) assignments per MoE layer and expert (or slot) into step-stamped ring entries.

    ``slot_to_expert`` (optional) [L, P]: the logical expert of every physical slot; given, ``capture``
    takes slot ids and logical counts are derived. ``dp_size`` > 1 keeps a DP signature per entry.
    """

    def __init__(
        self,
        num_moe_layers: int,
        num_experts: int,
        entries: int,
        device: torch.device | str = "cpu",
        slot_to_expert: torch.Tensor | None = None,
        time_moe: bool = False,
        live: bool = True,
        steps_per_entry: int = 1,
        dp_size: int = 1,
        source_rows: bool = False,
    ):
        self.num_moe_layers, self.num_experts, self.entries = num_moe_layers, num_experts, entries
        self.time_moe, self.live_on, self.steps_per_entry = time_moe, live, steps_per_entry
        L = num_moe_layers
        self.slot_to_expert = None if slot_to_expert is None else slot_to_expert.to(device=device, dtype=torch.int64)
        if self.slot_to_expert is not None and (
            self.slot_to_expert.shape[0] != L or self.slot_to_expert.min() < 0 or self.slot_to_expert.max() >= num_experts
        ):
            raise SceneEplbError(f"slot_to_expert must be [{L}, P] of expert ids below {num_experts}")
        self.num_physical = None if self.slot_to_expert is None else self.slot_to_expert.shape[1]
        W = self.width = self.num_physical or num_experts
        self.skipped_col = W + 1  # the pass buffer's two extra columns: W not counted, W + 1 skipped passes
        self.pass_counts = torch.zeros((L, W + 2), dtype=torch.int32, device=device)
        self._fill = torch.full((), W, dtype=torch.int32, device=device)  # torch.where's not-counted operand
        self._ones = torch.ones(0, dtype=torch.int32, device=device)  # index_add_'s source, sliced (``reserve``)
        self.reserve(4096)
        self.live = torch.zeros((L, W + 2) if live else (0, W + 2), dtype=torch.int64, device=device)
        self.ring = torch.zeros((entries, L, W + 2), dtype=torch.int32, device=device)
        self.stamps = np.full(entries, -1, dtype=np.int64)  # the stamp each ring slot holds (-1: none)
        self.signature = np.zeros((entries, dp_size), dtype=np.int64) if dp_size > 1 else None
        self.skipped = torch.zeros((2, L), dtype=torch.int64, device=device)  # skipped passes: since bind, this record
        self.live_passes = 0
        self.step = 0  # the global step of the pass being run
        self.recording = False
        self.entry: int | None = None  # the stamp being written
        self.entries_written = 0
        self.passes_recorded = 0
        self.has_record = False
        self._dp_tokens: list[int] | None = None
        self._pass_tokens = 0  # the engine's scheduled tokens of the pass being run (begin_step)
        self.tokens_recorded = 0
        self.moe_seconds = [0.0] * L  # cumulative, host
        self.moe_passes, self.steps = 0, 0
        self.step_seconds, self.step_moe_seconds = 0.0, 0.0
        self._pass_seconds = [0.0] * L
        self._step_started: float | None = None
        self.device_timer = None  # attach_device_timer: MoE time from device timestamps (CUDA graphs)
        self._init_sources(source_rows, device)

    def capture(
        self, moe_idx: int, ids: torch.Tensor, padding_rows: torch.Tensor | None = None, own_rows: torch.Tensor | None = None
    ) -> None:
        """Add one pass's ids [M, k] (int32 or int64) of MoE layer ``moe_idx``; traceable, at most
        four device ops (where, clamp, remainder, index_add_), none with a Python scalar operand.
        Rows are left out where ``padding_rows`` [>= M] is True or ``own_rows`` [>= M] is False (at
        most one of the two); ids outside [0, W) go to the not-counted column."""
        self._count(self.pass_counts[moe_idx], ids, padding_rows, own_rows)

    def _count(
        self, row: torch.Tensor, ids: torch.Tensor, padding_rows: torch.Tensor | None, own_rows: torch.Tensor | None = None
    ) -> None:
        """The four ops of a capture into one pass buffer row [W + 2] (``capture`` says which rows count)."""
        W = self.width
        if padding_rows is not None:
            ids = torch.where(padding_rows[: ids.shape[0]].unsqueeze(1), self._fill, ids)
        elif own_rows is not None:
            ids = torch.where(own_rows[: ids.shape[0]].unsqueeze(1), ids, self._fill)
        idx = ids.clamp(-1, W).remainder(W + 1).reshape(-1)  # -1 (and W) -> W: the not-counted column
        row.index_add_(0, idx, self._ones_for(idx.shape[0]))

    def reserve(self, ids: int) -> None:
        """Preallocate the ones ``capture`` adds for up to ``ids`` (token, top-k) ids a pass (host,
        before any graph is captured: an adapter that knows its largest pass reserves it at bind)."""
        if ids > self._ones.shape[0]:
            self._ones = torch.ones(ids, dtype=torch.int32, device=self._ones.device)

    def _ones_for(self, n: int) -> torch.Tensor:
        """``n`` ones, a contiguous slice (a view) of the preallocated buffer. An eager pass larger
        than the reserve grows it; traced by torch.compile nothing is compared with ``n`` (no guard on
        the token count), so an adapter whose MoE layer is compiled reserves its largest pass at bind."""
        if not torch.compiler.is_compiling() and n > self._ones.shape[0]:
            self.reserve(max(n, 2 * self._ones.shape[0]))
        return self._ones[:n]

    def skip(self, moe_idx: int) -> None:
        """Count nothing for MoE layer ``moe_idx`` in this pass and mark it skipped; traceable, one op
        (under graph capture the skip is replayed with the graph, so every replay is marked)."""
        self.pass_counts[moe_idx, self.skipped_col].add_(1)

    def begin_step(self, tokens: int = 0) -> None:
        """The engine starts a step (host) of ``tokens`` scheduled tokens: its wall time runs from here to ``end_step``."""
        self._pass_tokens = tokens
        if self.time_moe:
            self._step_started = time.perf_counter()

    def add_moe_seconds(self, moe_idx: int, seconds: float) -> None:
        """This pass's local expert time of MoE layer ``moe_idx`` (host, called by the adapter's timer)."""
        self._pass_seconds[moe_idx] += seconds

    def discard_pass(self) -> None:
        """Drop what the pass buffer holds (host, between passes): a pass the engine runs outside its
        steps (a warm-up, ``skip_eplb``, under EPLB's ``suppress()``) never reaches the counts, and
        each step starts from a cleared buffer. The ring, the live counts and the clock are untouched."""
        self.pass_counts.zero_()
        self._pass_seconds = [0.0] * self.num_moe_layers

    def note_dp_tokens(self, tokens) -> None:
        """This step's tokens per DP rank (host; a list or a CPU tensor), as every DP engine agreed them for the step."""
        self._dp_tokens = [int(t) for t in (tokens.tolist() if hasattr(tokens, "tolist") else tokens)]

    def end_step(self, is_dummy: bool = False) -> None:
        """Close one forward pass: add it to the live counts and, while recording, to its ring entry
        (a dummy pass adds nothing but still advances the ring); then clear it."""
        if self.recording:
            self._to_ring(is_dummy)
        if not is_dummy:
            self.skipped[0].add_(self.pass_counts[:, self.skipped_col])
            if self.live_on:
                self.live.add_(self.pass_counts)
                self.live_passes += 1
        if self.time_moe:
            self._end_timing(is_dummy)
        self._end_sources(is_dummy)
        self.pass_counts.zero_()
        self.step += 1
        self._dp_tokens, self._pass_tokens = None, 0

    def _to_ring(self, is_dummy: bool) -> None:
        """Add this pass to the entry of its global step, opening the entry (zeroed, stamped) on its first step."""
        stamp = self.step // self.steps_per_entry
        slot = stamp % self.entries
        if stamp != self.entry:
            self.ring[slot].zero_()
            self._sources_to_ring(slot, opened=True)
            self.stamps[slot] = stamp
            if self.signature is not None:
                self.signature[slot] = 0
            self.entry = stamp
            self.entries_written += 1
        if not is_dummy:
            self.ring[slot].add_(self.pass_counts)
            self._sources_to_ring(slot, opened=False)
            self.skipped[1].add_(self.pass_counts[:, self.skipped_col])
            self.passes_recorded += 1
            self.tokens_recorded += self._pass_tokens
        if self.signature is not None and self._dp_tokens is not None and len(self._dp_tokens) == self.signature.shape[1]:
            self.signature[slot] += self._dp_tokens

    def attach_device_timer(self, timer) -> None:
        """Take MoE time from ``timer`` (``runtime.device_timer.DeviceMoeTimer``: device timestamps that
        graph replays keep) instead of ``add_moe_seconds``; the steps' wall time stays the host's."""
        self.device_timer = timer

    def _end_device_timing(self, is_dummy: bool) -> None:
        """A step boundary with the device timer: the host's step wall time, the device's MoE time in it."""
        started, timer = self._step_started, self.device_timer
        assert timer is not None
        real = not is_dummy and started is not None
        if started is not None and real:
            self.step_seconds += time.perf_counter() - started
            self.steps += 1
        timer.mark_step(real)
        self._step_started = None

    def _timing(self) -> tuple[list[float] | None, int, float]:
        """(MoE seconds per layer or None, passes that ran them, MoE seconds inside real steps)."""
        if self.device_timer is not None:
            return self.device_timer.read()
        return (list(self.moe_seconds) if self.time_moe else None), self.moe_passes, self.step_moe_seconds

    def _end_timing(self, is_dummy: bool) -> None:
        """Add this pass's MoE seconds (a dummy pass's too) and, for a real step with a start, its wall time."""
        if self.device_timer is not None:
            return self._end_device_timing(is_dummy)
        if any(self._pass_seconds):
            if not is_dummy and self._step_started is not None:
                self.step_seconds += time.perf_counter() - self._step_started
                self.step_moe_seconds += sum(self._pass_seconds)
                self.steps += 1
            self.moe_seconds = [a + b for a, b in zip(self.moe_seconds, self._pass_seconds)]
            self.moe_passes += 1
        self._pass_seconds = [0.0] * self.num_moe_layers
        self._step_started = None

    def _init_sources(self, source_rows: bool, device) -> None:
        """With ``source_rows``, the own rows' buffers (pass [L, W + 2], ring, live); None otherwise:
        the counted rows are the own rows."""
        shape = self.pass_counts.shape
        self.pass_sources = torch.zeros(shape, dtype=torch.int32, device=device) if source_rows else None
        self.ring_sources = torch.zeros((self.entries, *shape), dtype=torch.int32, device=device) if source_rows else None
        live = source_rows and self.live_on
        self.live_sources = torch.zeros(shape, dtype=torch.int64, device=device) if live else None

    def capture_sources(self, moe_idx: int, ids: torch.Tensor, padding_rows: torch.Tensor | None = None) -> None:
        """Add the ids [m, k] of MoE layer ``moe_idx`` on the rows this rank routes itself (a slice of
        the pass's rows), leaving out those where ``padding_rows`` [>= m] is True; traceable, at most
        four device ops. Only with ``source_rows``."""
        assert self.pass_sources is not None, "capture_sources needs an observer made with source_rows=True"
        self._count(self.pass_sources[moe_idx], ids, padding_rows)

    def _sources_to_ring(self, slot: int, opened: bool) -> None:
        """``_to_ring`` for the own rows: ring slot ``slot`` zeroed as it is ``opened``, else the pass added."""
        if self.ring_sources is None or self.pass_sources is None:
            return
        if opened:
            self.ring_sources[slot].zero_()
        else:
            self.ring_sources[slot].add_(self.pass_sources)

    def _end_sources(self, is_dummy: bool) -> None:
        """The own rows' pass into the live counts (a real pass), then cleared."""
        if self.pass_sources is None:
            return
        if not is_dummy and self.live_sources is not None:
            self.live_sources.add_(self.pass_sources)
        self.pass_sources.zero_()

    def _views(self, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Counts [..., L, W + 2] as (logical [..., L, E], physical [..., L, P] or None), int64 on CPU."""
        counts = counts[..., : self.width].to("cpu", torch.int64)
        if self.slot_to_expert is None:
            return counts, None
        index = self.slot_to_expert.to("cpu").expand(counts.shape)
        logical = torch.zeros((*counts.shape[:-1], self.num_experts), dtype=torch.int64)
        return logical.scatter_add_(-1, index, counts), counts

    def live_counts(self) -> LiveCounts | None:
        """The cumulative counts (and times) of every real pass so far, on CPU (between steps only);
        None when live counting is off."""
        if not self.live_on:
            return None
        logical, physical = self._views(self.live)
        moe_seconds, moe_passes, step_moe_seconds = self._timing()
        return LiveCounts(
            logical,
            physical,
            self.live_passes,
            moe_seconds,
            moe_passes,
            self.steps,
            self.step_seconds,
            step_moe_seconds,
            self._views(self.live_sources)[0] if self.live_sources is not None else logical,
        )

    def skipped_passes(self) -> tuple[int, int]:
        """(layer, pass) pairs skipped since bind and in the current or last record (a host sync:
        between steps only)."""
        total, record = self.skipped.sum(dim=1).tolist()
        return int(total), int(record)

    def start(self) -> None:
        """Start a new record: clear the ring and count every following pass."""
        if self.recording:
            raise SceneEplbError("recording is already on: stop it (and dump) before starting again")
        self.ring.zero_()
        if self.ring_sources is not None:
            self.ring_sources.zero_()
        self.stamps[:] = -1
        self.skipped[1].zero_()
        self.entry, self.entries_written, self.passes_recorded, self.tokens_recorded = None, 0, 0, 0
        self.recording, self.has_record = True, True

    def stop(self) -> None:
        if not self.recording:
            raise SceneEplbError("recording is not on: start it first")
        self.recording = False

    def snapshot(self) -> Record:
        """The record's ring entries in time order, on CPU; refuses while recording or before any record."""
        if self.recording:
            raise SceneEplbError("recording is on: stop it before dumping")
        if not self.has_record:
            raise SceneEplbError("nothing recorded yet: start and stop a record before dumping")
        order = np.flatnonzero(self.stamps >= 0)
        order = order[np.argsort(self.stamps[order], kind="stable")]
        index = torch.from_numpy(order).to(self.ring.device)
        logical, physical = self._views(self.ring[index])
        return Record(
            logical,
            physical,
            self.stamps[order].copy(),
            None if self.signature is None else self.signature[order].copy(),
            self.steps_per_entry,
            self.passes_recorded,
            self.tokens_recorded,
            self.entries_written > self.entries,
            logical if self.ring_sources is None else self._views(self.ring_sources[index])[0],
        )

    def status(self) -> ObserverStatus:
        total, record = self.skipped_passes()
        state = OBSERVER_RECORDING if self.recording else OBSERVER_IDLE
        return ObserverStatus(state, self.entries, min(self.entries_written, self.entries), self.passes_recorded, total, record)


class NullObserver:
    """The observer before the model is bound: counts nothing, refuses control."""

    def __init__(self, role: str, entries: int):
        self.role, self.entries = role, entries

    def _refuse(self, *args, **kwargs):
        raise SceneEplbError(f"the recorder is off on this server (role {self.role}): no model bound or no counts here")

    start = stop = snapshot = _refuse

    def skip(self, moe_idx: int) -> None:
        pass

    def note_dp_tokens(self, tokens) -> None:
        pass

    def discard_pass(self) -> None:
        pass

    def add_moe_seconds(self, moe_idx: int, seconds: float) -> None:
        pass

    def begin_step(self, tokens: int = 0) -> None:
        pass

    def end_step(self, is_dummy: bool = False) -> None:
        pass

    def live_counts(self) -> None:
        return None

    def status(self) -> ObserverStatus:
        return ObserverStatus(OBSERVER_OFF, self.entries, 0, 0)
