"""The MoE timer: each MoE layer's local expert time per pass and the steps' wall time (``time_moe``).

The adapter reports a layer's expert seconds (``add_moe_seconds``, differences of ``kernel_clock``
around the rank's own expert computation: on CPU the stepping thread's CPU time, the time the kernel
ran, as a device timer would see it; where the API server, engine core and client preempt a rank on
a shared core, or a virtual machine's host takes its vCPU (steal), that time lands in the step, not
in the rank's MoE time) or, on CUDA, attaches a ``device_timer.DeviceMoeTimer`` whose
accumulators graph replays keep; the step's wall time is the host's, from ``begin_step`` to
``end_step``, and so is the pause between one step's end and the next one's start (scheduling,
sampling, the API server's and the client's share of the machine: time a layout does not change,
but which a step's throughput pays); a pause of ``IDLE_PAUSE_S`` or more is the engine waiting for
work and is left out. Beside the wall clock, on CPU, the stepping thread's run-queue wait inside the
real steps (``run_queue.RunQueueWait``: other work on the rank's core), and the MoE seconds of each
pass-size group's real passes (``slot_activity``). Cumulative, read with the live counts. Off,
nothing is timed.

**The pass log**: with host timing, each of the last ``PASS_LOG`` passes that ran MoE (dummy ones
too: an idle DP rank's experts still hold its peers' barrier), numbered as ``moe_passes`` counts
them, with its MoE ms per layer. Every EP rank runs the same passes in the same order, so the API
server lines the ranks' logs up by number and reads the MoE critical path pass by pass: per layer
the slowest rank *of that pass*, which no rank's mean shows (``live.measured.per_pass_critical``).
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING

from ...protocol import GROUPS, PassTimes

if TYPE_CHECKING:
    from .device_timer import DeviceMoeTimer
    from .run_queue import RunQueueWait

MoeTimes = tuple[list[float] | None, int, int, float, float, float, int]  # LiveTotalsSnapshot' timing fields, moe_seconds .. gaps
IDLE_PAUSE_S = 0.5  # a pause between steps this long is the engine idle, waiting for work, not part of a busy loop
PASS_LOG = 512  # the passes whose per-layer MoE ms a rank keeps (a record's last ones, for its per-pass critical path)


class MoeTiming:
    """Cumulative MoE seconds per layer [L] over ``moe_passes`` passes, over ``steps`` real steps
    their wall seconds and the MoE seconds within them, and the ``gap_seconds`` of the ``gaps``
    busy pauses between steps (host floats); with a ``wait`` reader, the run-queue ``wait_seconds``
    inside those real steps; per pass-size group the MoE seconds of its real passes [G][L]. ``cpu``:
    the experts run on the host, and ``kernel_clock`` is the thread's CPU time."""

    def __init__(self, num_layers: int, on: bool = False, wait: RunQueueWait | None = None, cpu: bool = False):
        self.num_layers, self.on, self.wait, self.cpu = num_layers, on, wait, cpu
        self.moe_seconds = [0.0] * num_layers  # cumulative, host
        self.moe_passes, self.steps = 0, 0
        self.step_seconds, self.step_moe_seconds = 0.0, 0.0
        self.gap_seconds, self.gaps = 0.0, 0
        self.wait_seconds = 0.0
        self.group_seconds = [[0.0] * num_layers for _ in range(GROUPS)]
        self._pass_seconds = [0.0] * num_layers
        self._wait_started: float | None = None
        self._step_started: float | None = None
        self._step_ended: float | None = None  # the last step's end: the next start's pause runs from here
        self.pass_log: deque[tuple[int, tuple[float, ...]]] = deque(maxlen=PASS_LOG)  # (pass number, ms per layer)
        self.device_timer: DeviceMoeTimer | None = None  # attach_device_timer: MoE time from device timestamps

    def begin_step(self) -> None:
        """The engine starts a step: its wall time runs from here to ``end_step``; the pause since
        the last step's end counts unless the engine was idle (``IDLE_PAUSE_S``)."""
        if self.on:
            now = self._step_started = time.perf_counter()
            if self._step_ended is not None and now - self._step_ended < IDLE_PAUSE_S:
                self.gap_seconds += now - self._step_ended
                self.gaps += 1
            self._step_ended = None
            self._wait_started = None if self.wait is None else self.wait.read()

    def kernel_clock(self) -> float:
        """Seconds of the calling thread's CPU time on CPU (``clock_gettime(CLOCK_THREAD_CPUTIME_ID)``,
        about 1 us: no run-queue wait, and no steal where the kernel accounts it), the wall clock
        elsewhere; an adapter's host timer takes differences of it."""
        return time.thread_time() if self.cpu else time.perf_counter()

    def add_moe_seconds(self, moe_idx: int, seconds: float) -> None:
        """This pass's local expert time of MoE layer ``moe_idx`` (host, called by the adapter's timer)."""
        self._pass_seconds[moe_idx] += seconds

    def attach_device_timer(self, timer: DeviceMoeTimer) -> None:
        """Take MoE time from ``timer`` (device timestamps that graph replays keep) instead of
        ``add_moe_seconds``; the steps' wall time stays the host's."""
        self.device_timer = timer

    def discard_pass(self) -> None:
        """Drop the pass's MoE seconds (a pass outside the engine's steps), the device timer's since its
        mark too (else they would land in the next real step's); the clock is untouched."""
        self._pass_seconds = [0.0] * self.num_layers
        if self.device_timer is not None:
            self.device_timer.discard()

    def end_step(self, is_dummy: bool, group: int = 0) -> None:
        """Add this pass's MoE seconds (a dummy pass's too; a real one's to its size ``group`` too) and,
        for a real step with a start, its wall time and the run-queue wait in it."""
        if not self.on:
            return
        now = self._step_ended = time.perf_counter()
        if self.device_timer is not None:
            return self._end_device_step(self.device_timer, is_dummy, now, group)
        if any(self._pass_seconds):
            if not is_dummy and self._step_started is not None:
                self._add_step(now - self._step_started)
                self.step_moe_seconds += sum(self._pass_seconds)
            if not is_dummy:
                self.group_seconds[group] = [a + b for a, b in zip(self.group_seconds[group], self._pass_seconds)]
            self.moe_seconds = [a + b for a, b in zip(self.moe_seconds, self._pass_seconds)]
            self.pass_log.append((self.moe_passes, tuple(round(1000.0 * x, 4) for x in self._pass_seconds)))
            self.moe_passes += 1
        self._pass_seconds = [0.0] * self.num_layers
        self._step_started = None

    def _add_step(self, seconds: float) -> None:
        """A real step of ``seconds`` wall time, and the run-queue wait since its start."""
        self.step_seconds += seconds
        self.steps += 1
        if self.wait is not None and self._wait_started is not None:
            now = self.wait.read()
            if now is not None:
                self.wait_seconds += max(now - self._wait_started, 0.0)

    def _end_device_step(self, timer: DeviceMoeTimer, is_dummy: bool, now: float, group: int) -> None:
        """A step boundary with the device timer: the host's step wall time, the device's MoE time in it."""
        started = self._step_started
        real = not is_dummy and started is not None
        if started is not None and real:
            self._add_step(now - started)
        timer.mark_step(real, group)
        self._step_started = None

    def passes_since(self, first: int) -> PassTimes | None:
        """The logged passes numbered ``first`` on (the last ``PASS_LOG`` at most), with their number
        and MoE ms per layer; None where none is logged (off, a device timer, no pass since)."""
        rows = [(n, ms) for n, ms in self.pass_log if n >= first]
        if not self.on or self.device_timer is not None or not rows:
            return None
        return PassTimes(rows[0][0], tuple(ms for _, ms in rows))

    def run_queue_wait(self) -> float | None:
        """Seconds the stepping thread waited on a run queue inside the real steps; None where not read
        (off, no reader, or the reader found no schedstat)."""
        if not self.on or self.wait is None or self.wait.broken:
            return None
        return self.wait_seconds

    def group_moe_seconds(self) -> list[list[float]]:
        """The MoE seconds [G][L] of each pass-size group's real passes (with the device timer a host sync)."""
        if self.device_timer is not None:
            return self.device_timer.group_seconds()
        return [list(row) for row in self.group_seconds]

    def read(self) -> MoeTimes:
        """(MoE seconds per layer or None when off, passes that ran them, real steps, their wall
        seconds, MoE seconds inside them, busy pauses' seconds, their number); with the device
        timer a host sync, between steps only."""
        if self.device_timer is not None:
            moe_seconds, moe_passes, step_moe_seconds = self.device_timer.read()
            return moe_seconds, moe_passes, self.steps, self.step_seconds, step_moe_seconds, self.gap_seconds, self.gaps
        return (
            (list(self.moe_seconds) if self.on else None),
            self.moe_passes,
            self.steps,
            self.step_seconds,
            self.step_moe_seconds,
            self.gap_seconds,
            self.gaps,
        )
