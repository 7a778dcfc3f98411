"""The id space a capture counts, and the two views of its counts.

The adapter hands the observer physical slot ids [M, k] (after the layout's logical -> physical
mapping) when it gives ``slot_to_expert`` [L, P]: the measured replica traffic; logical expert ids
otherwise (no physical view). A count row holds the W counts of that space and two more columns:
``W`` for ids not counted (padding rows, ids outside [0, W): zero experts, shared-expert pseudo ids)
and ``W + 1`` for the layer's skipped passes. Logical counts [L, E] are derived from physical ones
when read (a slot serves one expert), not per layer: one count, two views.
"""

from __future__ import annotations

import torch

from ...errors import SceneEplbError


class IdSpace:
    """The W ids a count row holds (P slots, or E experts) and how its counts read as logical and physical."""

    def __init__(self, num_layers: int, num_experts: int, device: torch.device | str, slot_to_expert: torch.Tensor | None):
        self.num_experts = num_experts
        self.slot_to_expert = None if slot_to_expert is None else slot_to_expert.to(device=device, dtype=torch.int64)
        if self.slot_to_expert is not None and (
            self.slot_to_expert.shape[0] != num_layers
            or self.slot_to_expert.min() < 0
            or self.slot_to_expert.max() >= num_experts
        ):
            raise SceneEplbError(f"slot_to_expert must be [{num_layers}, P] of expert ids below {num_experts}")
        self.num_physical = None if self.slot_to_expert is None else self.slot_to_expert.shape[1]
        self.width = self.num_physical or num_experts
        self.skipped_col = self.width + 1  # the two extra columns: W not counted, W + 1 skipped passes

    def views(self, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Counts [..., L, W + 2] as (logical [..., L, E], physical [..., L, P] or None), int64 on CPU."""
        counts = counts[..., : self.width].to("cpu", torch.int64)
        if self.slot_to_expert is None:
            return counts, None
        index = self.slot_to_expert.to("cpu").expand(counts.shape)
        logical = torch.zeros((*counts.shape[:-1], self.num_experts), dtype=torch.int64)
        return logical.scatter_add_(-1, index, counts), counts
