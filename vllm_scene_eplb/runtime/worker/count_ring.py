"""The recorder's ring buffer: step-stamped entries of summed passes, on the device (the circular buffer).

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

Everything here runs on the host between passes (``end_step``: while recording, the pass goes into
the entry of its global step), and the record's control: ``start``, ``stop``, ``snapshot``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ...errors import SceneEplbError
from .id_space import IdSpace
from .pass_counts import PassCounts


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


class CountRing:
    """``entries`` ring entries [T, L, W + 2] int32 (and the own rows' alike, with ``sources``), their
    stamps and DP signature, the global step clock and the record's state."""

    def __init__(
        self,
        entries: int,
        row_shape: tuple[int, int],
        device: torch.device | str,
        steps_per_entry: int = 1,
        dp_size: int = 1,
        sources: bool = False,
    ):
        self.entries, self.steps_per_entry = entries, steps_per_entry
        self.counts = torch.zeros((entries, *row_shape), dtype=torch.int32, device=device)
        self.sources = torch.zeros((entries, *row_shape), dtype=torch.int32, device=device) if sources else None
        self.stamps = np.full(entries, -1, dtype=np.int64)  # the stamp each ring slot holds (-1: none)
        self.signature = np.zeros((entries, dp_size), dtype=np.int64) if dp_size > 1 else None
        self.step = 0  # the global step of the pass being run
        self.recording = False
        self.has_record = False
        self.entry: int | None = None  # the stamp being written
        self.entries_written = 0
        self.passes_recorded = 0
        self.tokens_recorded = 0
        self._dp_tokens: list[int] | None = None
        self._pass_tokens = 0  # the engine's scheduled tokens of the pass being run (begin_step)

    def begin_step(self, tokens: int) -> None:
        """The engine starts a step of ``tokens`` scheduled tokens (what a record's ``tokens`` sums)."""
        self._pass_tokens = tokens

    def note_dp_tokens(self, tokens) -> None:
        """This step's tokens per DP rank (host; a list or a CPU tensor), as every DP engine agreed them for the step."""
        self._dp_tokens = [int(t) for t in (tokens.tolist() if hasattr(tokens, "tolist") else tokens)]

    def end_step(self, passes: PassCounts, is_dummy: bool) -> None:
        """Close the global step: while recording, add its pass to its entry (a dummy pass adds nothing
        but still advances the ring); then the clock moves on."""
        if self.recording:
            self._add(passes, is_dummy)
        self.step += 1
        self._dp_tokens, self._pass_tokens = None, 0

    def _add(self, passes: PassCounts, is_dummy: bool) -> None:
        """Add this pass to the entry of its global step, opening the entry (zeroed, stamped) on its first step."""
        stamp = self.step // self.steps_per_entry
        slot = stamp % self.entries
        if stamp != self.entry:
            self.counts[slot].zero_()
            if self.sources is not None:
                self.sources[slot].zero_()
            self.stamps[slot] = stamp
            if self.signature is not None:
                self.signature[slot] = 0
            self.entry = stamp
            self.entries_written += 1
        if not is_dummy:
            self.counts[slot].add_(passes.counts)
            if self.sources is not None and passes.sources is not None:
                self.sources[slot].add_(passes.sources)
            self.passes_recorded += 1
            self.tokens_recorded += self._pass_tokens
        if self.signature is not None and self._dp_tokens is not None and len(self._dp_tokens) == self.signature.shape[1]:
            self.signature[slot] += self._dp_tokens

    def start(self) -> None:
        """Start a new record: clear the ring and count every following pass."""
        if self.recording:
            raise SceneEplbError("recording is already on: stop it (and dump) before starting again")
        self.counts.zero_()
        if self.sources is not None:
            self.sources.zero_()
        self.stamps[:] = -1
        self.entry, self.entries_written, self.passes_recorded, self.tokens_recorded = None, 0, 0, 0
        self.recording, self.has_record = True, True

    def stop(self) -> None:
        if not self.recording:
            raise SceneEplbError("recording is not on: start it first")
        self.recording = False

    def snapshot(self, space: IdSpace) -> Record:
        """The record's ring entries in time order, on CPU; refuses while recording or before any record."""
        if self.recording:
            raise SceneEplbError("recording is on: stop it before dumping")
        if not self.has_record:
            raise SceneEplbError("nothing recorded yet: start and stop a record before dumping")
        order = np.flatnonzero(self.stamps >= 0)
        order = order[np.argsort(self.stamps[order], kind="stable")]
        index = torch.from_numpy(order).to(self.counts.device)
        logical, physical = space.views(self.counts[index])
        return Record(
            logical,
            physical,
            self.stamps[order].copy(),
            None if self.signature is None else self.signature[order].copy(),
            self.steps_per_entry,
            self.passes_recorded,
            self.tokens_recorded,
            self.entries_written > self.entries,
            logical if self.sources is None else space.views(self.sources[index])[0],
        )
