"""The graph-safe MoE timer on a machine without CUDA: its refusal, and how the observer reads a
device timer (the timer's device part runs in ``scripts/gpu_check.sh``, on a GPU only).

``DeviceTimerStandIn`` (named so) holds the same accumulators as ``DeviceMoeTimer`` on CPU and its
``start`` / ``stop`` write given timestamps where the Triton kernels would read the GPU's clock;
``mark_step`` and ``read`` are the real timer's own methods.
"""

import pytest
import torch

from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.runtime.device_timer import DeviceMoeTimer
from vllm_scene_eplb.runtime.observer import RoutingObserver


class DeviceTimerStandIn(DeviceMoeTimer):
    def __init__(self, num_layers: int):  # the real accumulators, on CPU
        z = lambda n: torch.zeros(n, dtype=torch.int64)  # noqa: E731
        self.t0, self.ns, self.passes = z(num_layers), z(num_layers), z(num_layers)
        self.real_ns, self.mark = z(1), z(1)
        self.clock = 0

    def start(self, layer: int) -> None:
        self.t0[layer] = self.clock

    def stop(self, layer: int) -> None:
        self.ns[layer] += self.clock - self.t0[layer]
        self.passes[layer] += 1


def test_the_timer_needs_a_cuda_device():
    with pytest.raises(SceneEplbError, match="needs a CUDA device"):
        DeviceMoeTimer(2, "cpu")


def test_the_observer_reads_moe_time_from_the_device_timer_and_keeps_real_steps_apart():
    obs = RoutingObserver(2, 4, 2, time_moe=True)
    timer = DeviceTimerStandIn(2)
    obs.attach_device_timer(timer)

    def run_pass(ns_per_layer: list[int], is_dummy: bool) -> None:
        obs.begin_step(8)
        for layer, ns in enumerate(ns_per_layer):
            timer.timed(layer, lambda ns=ns: setattr(timer, "clock", timer.clock + ns))()
        obs.end_step(is_dummy)

    run_pass([1000, 3000], False)
    run_pass([500, 500], True)  # a dummy pass: its MoE time counts, not inside a real step
    run_pass([2000, 1000], False)
    live = obs.live_counts()
    assert live.moe_seconds == pytest.approx([3500e-9, 4500e-9])
    assert live.moe_passes == 3 and live.steps == 2
    assert live.step_moe_seconds == pytest.approx(7000e-9) and live.step_seconds > 0
