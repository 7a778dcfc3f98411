"""Per-layer MoE time on a CUDA device that survives CUDA graphs: two one-program Triton kernels read
the GPU's global timer (nanoseconds) around a layer's local expert computation, on the same stream,
into per-layer accumulators allocated before any capture. A graph captured with them replays them,
so every replay adds its time; nothing syncs the host in the forward; ``read`` (a host sync) runs
with the live window, between steps.

Stream order makes the pair bracket the expert kernels: ``start`` runs after the work queued before
it, ``stop`` after the expert kernels. Fallback: none is built; where Triton cannot compile for
the device (no Triton, not an NVIDIA GPU) ``DeviceMoeTimer`` raises and the adapter refuses
``time_moe`` at bind with that message.
"""

from __future__ import annotations

import torch

from ...errors import SceneEplbError
from ...protocol import GROUPS

_KERNELS: tuple | None = None


def _kernels() -> tuple:
    """The two Triton kernels (compiled on first launch): ``start`` and ``stop``."""
    global _KERNELS
    if _KERNELS is None:
        import triton
        import triton.language as tl
        from triton.language.extra.cuda import globaltimer

        @triton.jit
        def start(t0_ptr, layer):
            tl.store(t0_ptr + layer, globaltimer())

        @triton.jit
        def stop(t0_ptr, ns_ptr, passes_ptr, layer):
            now = globaltimer()
            tl.store(ns_ptr + layer, tl.load(ns_ptr + layer) + (now - tl.load(t0_ptr + layer)))
            tl.store(passes_ptr + layer, tl.load(passes_ptr + layer) + 1)

        _KERNELS = (start, stop)
    return _KERNELS


class DeviceMoeTimer:
    """Cumulative device time [L] (ns) and passes [L] of each MoE layer's local experts, plus the
    share of that time inside real steps (``mark_step``) less the discarded passes' (``discard``);
    host-launched device ops between steps."""

    def __init__(self, num_layers: int, device: torch.device | str):
        device = torch.device(device)
        if device.type != "cuda":
            raise SceneEplbError(f"the graph-safe MoE timer needs a CUDA device, got {device}")
        try:
            _kernels()
        except ImportError as exc:
            raise SceneEplbError(f"the graph-safe MoE timer needs Triton with its CUDA backend ({exc})") from exc
        self._allocate(num_layers, device)

    def _allocate(self, num_layers: int, device: torch.device | str) -> None:
        """The accumulators, before any graph capture (replays write these very buffers)."""
        z = lambda *shape: torch.zeros(shape, dtype=torch.int64, device=device)  # noqa: E731
        self.t0, self.ns, self.passes = z(num_layers), z(num_layers), z(num_layers)
        self.real_ns = z(1)  # MoE ns inside real steps
        self.group_ns = z(GROUPS, num_layers)  # MoE ns per layer of each pass-size group's real steps
        self.mark = z(2, num_layers)  # ns and passes per layer at the last step boundary or discard
        self.dropped = z(2, num_layers)  # ns and passes per layer of the discarded passes

    def start(self, layer: int) -> None:
        _kernels()[0][(1,)](self.t0, layer)

    def stop(self, layer: int) -> None:
        _kernels()[1][(1,)](self.t0, self.ns, self.passes, layer)

    def timed(self, layer: int, fn):
        """``fn`` with layer ``layer``'s start and stop around it."""

        def call(*args, **kwargs):
            self.start(layer)
            out = fn(*args, **kwargs)
            self.stop(layer)
            return out

        return call

    def mark_step(self, real: bool, group: int = 0) -> None:
        """At a step boundary (host, no sync): a real step's MoE time goes to ``real_ns`` and to its
        pass-size ``group``'s per-layer ns."""
        if real:
            since = self._since_mark()[0]
            self.real_ns.add_(since.sum(0, keepdim=True))
            self.group_ns[group].add_(since)
        self._move_mark()

    def discard(self) -> None:
        """Drop what ran since the last mark (host, no sync): a warm-up, a profile run or a pass under
        ``suppress()`` reaches neither the totals nor the next real step's MoE time."""
        self.dropped.add_(self._since_mark())
        self._move_mark()

    def _totals(self) -> torch.Tensor:
        """The cumulative ns and passes [2, L] of each layer (a new tensor, on the device)."""
        return torch.stack([self.ns, self.passes])

    def _since_mark(self) -> torch.Tensor:
        """The ns and passes [2, L] each layer ran since the mark."""
        return self._totals() - self.mark

    def _move_mark(self) -> None:
        """The mark at the totals now."""
        self.mark.copy_(self._totals())

    def read(self) -> tuple[list[float], int, float]:
        """(seconds per layer, passes, seconds inside real steps), the discarded passes left out, on
        the host: a sync, between steps only."""
        ns, passes = (self._totals() - self.dropped).tolist()
        return [n * 1e-9 for n in ns], max(passes, default=0), int(self.real_ns.item()) * 1e-9

    def group_seconds(self) -> list[list[float]]:
        """The MoE seconds [G][L] of each pass-size group's real steps, on the host: a sync, between steps only."""
        return [[n * 1e-9 for n in row] for row in self.group_ns.tolist()]
