"""vLLM-Ascend's own expert-load counters over a record window, in logical expert ids: a cross-check
of the recorder by a counter the plugin did not write.

With dynamic EPLB on, every ``AscendFusedMoE`` keeps ``moe_load``: tokens each local physical slot
received, after ``log2phy`` and the dispatch (``[E_local]``, or ``[stages, E_local]`` with the
multi-stage policy). ``NativeWindow`` reads it when recording starts and when it stops (between
steps) and turns the difference into logical counts with the layer's ``_expert_map`` (logical ->
local slot). Summed over every rank, that is what the engine itself computed for each expert.

Not equal to the recorder by construction: vLLM-Ascend also counts the rows it routes but does not
use (graph padding, idle DP ranks' dummy batches), which the recorder leaves out; its shared-expert
slots (``mix_placement``) are dropped here. The window is void when vLLM-Ascend rebalanced or
cleared its counters in between (a map or a counter that went back).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ...protocol import NativeCounts

UNAVAILABLE = "vLLM-Ascend keeps no moe_load counters on this server (they exist with eplb_config.dynamic_eplb only)"


def _read(layer) -> tuple[np.ndarray, np.ndarray] | None:
    """(slot loads [E_local] int64, expert map [E] logical -> local slot) of one layer, on the host."""
    load, emap = getattr(layer, "moe_load", None), getattr(layer, "_expert_map", None)
    if not isinstance(load, torch.Tensor) or not isinstance(emap, torch.Tensor):
        return None
    load = load.detach().to("cpu", torch.int64, copy=True)  # a copy: on a CPU tensor .to() would alias the live counter
    return (load.sum(dim=0) if load.dim() == 2 else load).numpy(), emap.detach().to("cpu", torch.int64, copy=True).numpy()


@dataclass
class NativeWindow:
    """This rank's vLLM-Ascend counters at the last record start and what they added until stop."""

    num_experts: int
    start: list | None = None
    result: NativeCounts = field(default_factory=lambda: NativeCounts(False, reason="no record has stopped yet"))

    def mark(self, action: str, layers: list) -> None:
        """``start``: remember the counters; ``stop``: the logical counts they added since."""
        reads = [_read(layer) for layer in layers]
        if action == "start":
            self.start = None if not reads or any(r is None for r in reads) else reads
            return
        self.result = self._window(reads)

    def _window(self, end: list) -> NativeCounts:
        if self.start is None or any(r is None for r in end):
            return NativeCounts(False, reason=UNAVAILABLE)
        counts = np.zeros((len(end), self.num_experts), dtype=np.int64)
        for k, ((load0, map0), (load1, map1)) in enumerate(zip(self.start, end)):
            if not np.array_equal(map0, map1):
                return NativeCounts(False, reason="vLLM-Ascend moved experts during the record (its dynamic EPLB)")
            delta = load1 - load0
            if (delta < 0).any():
                return NativeCounts(
                    False,
                    reason="vLLM-Ascend cleared its moe_load during the record (record fewer steps "
                    "than its EPLB update interval)",
                )
            for expert in np.flatnonzero((map1 >= 0) & (np.arange(map1.shape[0]) < self.num_experts)):
                counts[k, expert] += delta[map1[expert]]
        return NativeCounts(True, counts=tuple(map(tuple, counts.tolist())))
