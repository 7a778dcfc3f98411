"""The MoE timer: each MoE layer's local expert time per pass and the steps' wall time (``time_moe``).

The adapter reports a layer's expert seconds (``add_moe_seconds``, host wall clock around the
rank's own expert computation) or, on CUDA, attaches a ``device_timer.DeviceMoeTimer`` whose
accumulators graph replays keep; the step's wall time is the host's, from ``begin_step`` to
``end_step``. Cumulative per layer, read with the live counts. Off, nothing is timed.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .device_timer import DeviceMoeTimer

MoeTimes = tuple[list[float] | None, int, int, float, float]  # LiveCounts' timing fields, moe_seconds .. step_moe_seconds


class MoeTiming:
    """Cumulative MoE seconds per layer [L] over ``moe_passes`` passes, and over ``steps`` real
    steps their wall seconds and the MoE seconds within them (host floats)."""

    def __init__(self, num_layers: int, on: bool = False):
        self.num_layers, self.on = num_layers, on
        self.moe_seconds = [0.0] * num_layers  # cumulative, host
        self.moe_passes, self.steps = 0, 0
        self.step_seconds, self.step_moe_seconds = 0.0, 0.0
        self._pass_seconds = [0.0] * num_layers
        self._step_started: float | None = None
        self.device_timer: DeviceMoeTimer | None = None  # attach_device_timer: MoE time from device timestamps

    def begin_step(self) -> None:
        """The engine starts a step: its wall time runs from here to ``end_step``."""
        if self.on:
            self._step_started = time.perf_counter()

    def add_moe_seconds(self, moe_idx: int, seconds: float) -> None:
        """This pass's local expert time of MoE layer ``moe_idx`` (host, called by the adapter's timer)."""
        self._pass_seconds[moe_idx] += seconds

    def attach_device_timer(self, timer: DeviceMoeTimer) -> None:
        """Take MoE time from ``timer`` (device timestamps that graph replays keep) instead of
        ``add_moe_seconds``; the steps' wall time stays the host's."""
        self.device_timer = timer

    def discard_pass(self) -> None:
        """Drop the pass's MoE seconds (a pass outside the engine's steps); the clock is untouched."""
        self._pass_seconds = [0.0] * self.num_layers

    def end_step(self, is_dummy: bool) -> None:
        """Add this pass's MoE seconds (a dummy pass's too) and, for a real step with a start, its wall time."""
        if not self.on:
            return
        if self.device_timer is not None:
            return self._end_device_step(self.device_timer, is_dummy)
        if any(self._pass_seconds):
            if not is_dummy and self._step_started is not None:
                self.step_seconds += time.perf_counter() - self._step_started
                self.step_moe_seconds += sum(self._pass_seconds)
                self.steps += 1
            self.moe_seconds = [a + b for a, b in zip(self.moe_seconds, self._pass_seconds)]
            self.moe_passes += 1
        self._pass_seconds = [0.0] * self.num_layers
        self._step_started = None

    def _end_device_step(self, timer: DeviceMoeTimer, is_dummy: bool) -> None:
        """A step boundary with the device timer: the host's step wall time, the device's MoE time in it."""
        started = self._step_started
        real = not is_dummy and started is not None
        if started is not None and real:
            self.step_seconds += time.perf_counter() - started
            self.steps += 1
        timer.mark_step(real)
        self._step_started = None

    def read(self) -> MoeTimes:
        """(MoE seconds per layer or None when off, passes that ran them, real steps, their wall
        seconds, MoE seconds inside them); with the device timer a host sync, between steps only."""
        if self.device_timer is not None:
            moe_seconds, moe_passes, step_moe_seconds = self.device_timer.read()
            return moe_seconds, moe_passes, self.steps, self.step_seconds, step_moe_seconds
        return (
            (list(self.moe_seconds) if self.on else None),
            self.moe_passes,
            self.steps,
            self.step_seconds,
            self.step_moe_seconds,
        )
