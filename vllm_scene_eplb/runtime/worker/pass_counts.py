"""The pass buffers and the traced capture that fills them (the gatherer).

``capture`` runs inside the model's forward (traced by torch.compile or recorded into a device
graph): at most four fixed-shape device ops per MoE layer and pass, none with a Python scalar
operand, no host sync, no Python state that changes per step. Rows an adapter cannot attribute are
``skip``ped: nothing counted for that layer and pass, one op into the skipped column.

**Own rows** (the static table's source rows): the rows whose replica choice this rank's own static
table row makes. Where the counted rows are not all its own (TP ranks that all route the same batch,
split evenly over them: ``source_rows=True``), the adapter also hands them (a slice of the pass's
rows) to ``capture_sources``, which counts them into a pass buffer of their own, at most four more
device ops; elsewhere the counted rows are the own rows and nothing more runs.

On CUDA with Triton the four ops are one kernel (``fused_capture``: the same counts, one graph node),
except where torch.compile traces the capture (it then traces the torch ops, with no graph break).
"""

from __future__ import annotations

import torch

from . import fused_capture
from .id_space import IdSpace


class PassCounts:
    """One pass's counts [L, W + 2] int32 (and, with ``source_rows``, its own rows' [L, W + 2]),
    filled in the forward and cleared at each step boundary."""

    def __init__(self, num_layers: int, space: IdSpace, device: torch.device | str, source_rows: bool = False):
        W = self.width = space.width
        self.skipped_col = space.skipped_col
        self.counts = torch.zeros((num_layers, W + 2), dtype=torch.int32, device=device)
        self._fill = torch.full((), W, dtype=torch.int32, device=device)  # torch.where's not-counted operand
        self._ones = torch.ones(0, dtype=torch.int32, device=device)  # index_add_'s source, sliced (``reserve``)
        self.reserve(4096)
        self.sources = torch.zeros(self.counts.shape, dtype=torch.int32, device=device) if source_rows else None
        self.fused = fused_capture.available(device)  # one Triton kernel for the four ops (CUDA)
        if self.fused:
            fused_capture.warm(device, self.width)  # every variant compiled now, before any graph

    def capture(
        self, moe_idx: int, ids: torch.Tensor, padding_rows: torch.Tensor | None = None, own_rows: torch.Tensor | None = None
    ) -> None:
        """Add one pass's ids [M, k] (int32 or int64) of MoE layer ``moe_idx``; traceable, at most
        four device ops (where, clamp, remainder, index_add_), none with a Python scalar operand.
        Rows are left out where ``padding_rows`` [>= M] is True or ``own_rows`` [>= M] is False (at
        most one of the two); ids outside [0, W) go to the not-counted column."""
        self._count(self.counts[moe_idx], ids, padding_rows, own_rows)

    def capture_sources(self, moe_idx: int, ids: torch.Tensor, padding_rows: torch.Tensor | None = None) -> None:
        """Add the ids [m, k] of MoE layer ``moe_idx`` on the rows this rank routes itself (a slice of
        the pass's rows), leaving out those where ``padding_rows`` [>= m] is True; traceable, at most
        four device ops. Only with ``source_rows``."""
        assert self.sources is not None, "capture_sources needs an observer made with source_rows=True"
        self._count(self.sources[moe_idx], ids, padding_rows)

    def skip(self, moe_idx: int) -> None:
        """Count nothing for MoE layer ``moe_idx`` in this pass and mark it skipped; traceable, one op
        (under graph capture the skip is replayed with the graph, so every replay is marked)."""
        self.counts[moe_idx, self.skipped_col].add_(1)

    def _count(
        self, row: torch.Tensor, ids: torch.Tensor, padding_rows: torch.Tensor | None, own_rows: torch.Tensor | None = None
    ) -> None:
        """The four ops of a capture into one pass buffer row [W + 2] (``capture`` says which rows count),
        or the one fused kernel that does what they do."""
        W = self.width
        if self.fused and not torch.compiler.is_compiling():  # traced, the torch ops (Inductor fuses them)
            mask, mode = (padding_rows, fused_capture.PADDING) if padding_rows is not None else (own_rows, fused_capture.OWN)
            return fused_capture.count_into(row, ids, W, mask, mode)
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

    def clear(self) -> None:
        """Clear both buffers (host, between passes): once the pass is committed, or to drop it."""
        if self.sources is not None:
            self.sources.zero_()
        self.counts.zero_()
