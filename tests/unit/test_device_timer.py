"""The graph-safe MoE timer on a machine without CUDA: its refusal, and how the observer reads a
device timer (the timer's device part runs in ``scripts/gpu_check.sh``, on a GPU only).

``DeviceTimerStandIn`` (named so) holds the same accumulators as ``DeviceMoeTimer`` on CPU and its
``start`` / ``stop`` write given timestamps where the Triton kernels would read the GPU's clock;
``mark_step``, ``discard`` and ``read`` are the real timer's own methods.
"""

import pytest

from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.runtime.worker.device_timer import DeviceMoeTimer
from vllm_scene_eplb.runtime.worker.observer import RoutingObserver


class DeviceTimerStandIn(DeviceMoeTimer):
    def __init__(self, num_layers: int):  # the real accumulators, on CPU
        self._allocate(num_layers, "cpu")
        self.clock = 0

    def start(self, layer: int) -> None:
        self.t0[layer] = self.clock

    def stop(self, layer: int) -> None:
        self.ns[layer] += self.clock - self.t0[layer]
        self.passes[layer] += 1


def test_the_timer_needs_a_cuda_device():
    with pytest.raises(SceneEplbError, match="needs a CUDA device"):
        DeviceMoeTimer(2, "cpu")


def _timed_observer() -> tuple[RoutingObserver, DeviceTimerStandIn]:
    obs = RoutingObserver(2, 4, 2, time_moe=True)
    timer = DeviceTimerStandIn(2)
    obs.attach_device_timer(timer)
    return obs, timer


def _forward(timer: DeviceTimerStandIn, ns_per_layer: list[int]) -> None:
    """One pass's MoE layers, layer i taking ``ns_per_layer[i]`` on the stand-in's clock."""
    for layer, ns in enumerate(ns_per_layer):
        timer.timed(layer, lambda ns=ns: setattr(timer, "clock", timer.clock + ns))()


def test_the_observer_reads_moe_time_from_the_device_timer_and_keeps_real_steps_apart():
    obs, timer = _timed_observer()

    def run_pass(ns_per_layer: list[int], is_dummy: bool) -> None:
        obs.begin_step(8)
        _forward(timer, ns_per_layer)
        obs.end_step(is_dummy)

    run_pass([1000, 3000], False)
    run_pass([500, 500], True)  # a dummy pass: its MoE time counts, not inside a real step
    run_pass([2000, 1000], False)
    live = obs.live_counts()
    assert live.moe_seconds == pytest.approx([3500e-9, 4500e-9])
    assert live.moe_passes == 3 and live.steps == 2
    assert live.step_moe_seconds == pytest.approx(7000e-9) and live.step_seconds > 0


def test_a_discarded_warm_up_pass_adds_no_device_time_to_the_next_real_step():
    """A profile run, a ``skip_eplb`` / ``suppress()`` warm-up or a graph capture's warm-up ends no
    step and is discarded: its device time reaches neither the totals nor the first real step's MoE
    time (before the fix the timer's mark stayed put and the first real step took it)."""
    obs, timer = _timed_observer()
    _forward(timer, [7000, 9000])  # the warm-up, before any step
    obs.discard_pass()
    obs.begin_step(8)
    _forward(timer, [1000, 3000])
    obs.end_step(False)
    _forward(timer, [500, 500])  # a warm-up between steps
    obs.discard_pass()
    obs.begin_step(8)
    _forward(timer, [2000, 1000])
    obs.end_step(False)
    live = obs.live_counts()
    assert live.step_moe_seconds == pytest.approx(7000e-9)
    assert live.moe_seconds == pytest.approx([3000e-9, 4000e-9]) and live.moe_passes == 2 and live.steps == 2
