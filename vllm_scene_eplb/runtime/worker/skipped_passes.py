"""The skipped-pass counters: (MoE layer, pass) pairs an adapter could not attribute (``skip``),
counted as nothing and said so in status and in the dump's metadata."""

from __future__ import annotations

import torch


class SkippedPasses:
    """Skipped passes per MoE layer [2, L] int64 on the device: since bind (row 0), in the current or last record (row 1)."""

    def __init__(self, num_layers: int, device: torch.device | str):
        self.counts = torch.zeros((2, num_layers), dtype=torch.int64, device=device)

    def end_step(self, skipped: torch.Tensor, is_dummy: bool, recording: bool) -> None:
        """Add a real pass's skipped column [L] (a dummy pass adds nothing); to the record's too while recording."""
        if is_dummy:
            return
        if recording:
            self.counts[1].add_(skipped)
        self.counts[0].add_(skipped)

    def start_record(self) -> None:
        self.counts[1].zero_()

    def read(self) -> tuple[int, int]:
        """(since bind, in the record): a host sync, between steps only."""
        total, record = self.counts.sum(dim=1).tolist()
        return int(total), int(record)
