"""Each rank's active slots and its passes by size (``time_moe``, where the rank's counted rows are
every row its experts compute: every rank routes the whole batch, DP = 1).

A rank reads the weights of every local slot that computes at least one row, once a pass, whatever
the rows' number: its MoE time is a + b x assignments + c x active slots, and ``advise`` needs both x's.
At each real pass's boundary (host, between passes) the pass buffer's columns of this rank's local
slots [lo, hi) give both: their sum per MoE layer (assignments: real rows only, the capture leaves
padding out) and how many of them are above 0 (active slots). They are added, on the device and
without a host sync (five ops a pass, for all layers at once), to the sums of the pass's size group
(``protocol.pass_group`` of the tokens the engine scheduled for it); the MoE seconds of each group
are ``moe_timing``'s. Read with the live counts, between steps.
"""

from __future__ import annotations

import torch

from ...protocol import GROUPS


class SlotActivity:
    """Per pass-size group [G, 2, L] int64 on the device (row 0: the assignments on local slots
    [lo, hi), row 1: the active ones among them) and the real passes per group (host)."""

    def __init__(self, num_layers: int, local: tuple[int, int], device: torch.device | str):
        self.lo, self.hi = local
        self.totals = torch.zeros((GROUPS, 2, num_layers), dtype=torch.int64, device=device)
        self.passes = [0] * GROUPS

    def add(self, counts: torch.Tensor, group: int) -> None:
        """A real pass's counts [L, W + 2] (slot columns first) of size group ``group``: device ops, no sync."""
        local = counts[:, self.lo : self.hi]
        self.totals[group].add_(torch.stack((local.sum(dim=1), (local > 0).sum(dim=1))))
        self.passes[group] += 1

    def read(self) -> tuple[list[int], list[int], list[list[int]], list[list[int]]]:
        """(active slots per layer [L] over every real pass, passes per group [G], assignments [G][L],
        active slots [G][L]): a host sync, between steps only."""
        totals = self.totals.to("cpu")
        return totals[:, 1].sum(dim=0).tolist(), list(self.passes), totals[:, 0].tolist(), totals[:, 1].tolist()
