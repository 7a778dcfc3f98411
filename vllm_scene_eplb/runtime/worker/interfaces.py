"""What the engine adapters call on the runtime, as protocols (mypy checks every implementation):

- ``StepHooks``: the engine's step boundary, on the host between passes; a worker's plugin runtime
  and its observer alike;
- ``Observer``: what a worker plugin holds and drives (``RoutingObserver``, or ``NullObserver``
  before the model is bound): the step hooks and the record's control;
- ``LayerCapture``: what a MoE layer's capture calls inside the forward, traced (``RoutingObserver``);
- ``WorkerPlugin``: what the adapters' patches call on this worker plugin (``RecorderPlugin``'s
  subclasses, or the null plugin with the flag off).

``ObserverStatus`` is what an observer reports; ``NullSteps`` the no-op step hooks every null
object is built on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ...protocol import OBSERVER_RECORDING, PassTimes

if TYPE_CHECKING:
    from collections.abc import Iterable

    import torch

    from .count_ring import Record
    from .live_totals import LiveTotalsSnapshot


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


class StepHooks(Protocol):
    def begin_step(self, tokens: int = 0) -> None:
        """The engine starts a step of ``tokens`` scheduled tokens."""

    def end_step(self, is_dummy: bool) -> None:
        """The engine's step boundary: commit the pass just run (a dummy pass only advances the ring)."""

    def discard_pass(self) -> None:
        """Drop the pass being counted (a warm-up or ``skip_eplb`` pass; before each step: a clean start)."""

    def note_dp_tokens(self, tokens: Iterable[int] | torch.Tensor) -> None:
        """This step's tokens per DP rank, as the DP engines agreed them (the ring's DP signature)."""

    def add_moe_seconds(self, moe_idx: int, seconds: float) -> None:
        """This pass's local expert time of MoE layer ``moe_idx`` (``time_moe``: the adapter's timer)."""

    def kernel_clock(self) -> float:
        """Seconds of the calling thread's kernel clock: the adapter's host timer takes differences of it."""


class Observer(StepHooks, Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...

    def snapshot(self) -> Record: ...

    def live_counts(self) -> LiveTotalsSnapshot | None: ...

    def passes_since(self, first: int) -> PassTimes | None: ...

    def status(self) -> ObserverStatus: ...


class LayerCapture(Protocol):
    source_rows: bool  # the observer also counts the rows this rank routes itself (``capture_sources``)

    def capture(
        self, moe_idx: int, ids: torch.Tensor, padding_rows: torch.Tensor | None = None, own_rows: torch.Tensor | None = None
    ) -> None: ...

    def capture_sources(self, moe_idx: int, ids: torch.Tensor, padding_rows: torch.Tensor | None = None) -> None: ...

    def skip(self, moe_idx: int) -> None: ...


class WorkerPlugin(StepHooks, Protocol):
    def bind(self, model_runner: Any) -> None:
        """Attach the observer (and the adapter's maps) to the loaded model."""

    def control(self, action: str, *args: Any) -> dict:
        """A control action of the HTTP routes, answered between steps (never raises)."""


class NullSteps:
    """The step hooks doing nothing: the base of every null object (plugin off, model not bound)."""

    def begin_step(self, tokens: int = 0) -> None:
        pass

    def end_step(self, is_dummy: bool = False) -> None:
        pass

    def discard_pass(self) -> None:
        pass

    def note_dp_tokens(self, tokens: Iterable[int] | torch.Tensor) -> None:
        pass

    def add_moe_seconds(self, moe_idx: int, seconds: float) -> None:
        pass

    def kernel_clock(self) -> float:
        return time.perf_counter()
