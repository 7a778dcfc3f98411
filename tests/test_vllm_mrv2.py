"""Model Runner V2 (vLLM 0.33's default) through its released Python (``tests/vllm033_env``), with the
plugin's patches installed: vLLM's own ``step_eplb_after`` decorator, ``EPLBController`` (its
``step`` and ``suppress()``), ``dispatch_cg_and_sync_dp`` and the V2 runner's ``execute_model``
signature drive the observer. The stand-ins, named so: ``RunnerV2StandIn`` (a subclass of the real
V2 runner whose ``execute_model`` keeps the real signature and runs one "forward" of the scheduled
tokens through the real, patched ``BaseRouter._apply_eplb_mapping``, marking the padding rows in
``input_buffers.is_padding`` as the real one does; ``_dummy_run`` and ``sample_tokens`` carry vLLM's
real decorator) and ``DPGroupStandIn`` (the DP peer's side of the one CPU all-reduce).

The flow: a DP dummy step, a ``skip_eplb`` warm-up (under ``suppress()``), a warm-up of real steps
under ``suppress()`` (as the GPU worker runs it), then two real steps: only the two real steps'
tokens are counted, the ring advances on the dummy step and the real ones only, and each real step's
DP vector is what ``dispatch_cg_and_sync_dp`` agreed.
"""

from __future__ import annotations

import pytest

from . import vllm033_env

pytestmark = pytest.mark.engine

SCRIPT = r"""
import functools, inspect, json
from types import SimpleNamespace

import torch
import vllm

from vllm_scene_eplb.adapters.vllm import register, runtime
from vllm_scene_eplb.adapters.vllm import patches
from vllm_scene_eplb.runtime.observer import RoutingObserver
from vllm_scene_eplb.runtime.worker import RecorderRuntime

register()
from vllm.model_executor.layers.fused_moe.router.base_router import BaseRouter
from vllm.v1.worker.gpu import dp_utils, eplb_utils
from vllm.v1.worker.gpu import model_runner as v2_module

TOP_K, PEER_TOKENS, CAPACITY = 2, 7, 128

class DPGroupStandIn:  # the other DP rank's row of vLLM's one CPU all-reduce: it schedules PEER_TOKENS
    def cpu_all_reduce_(self, tensor):
        tensor[0][1] = PEER_TOKENS

dp_utils.get_dp_group = lambda: DPGroupStandIn()

ROUTER_STANDIN = SimpleNamespace(_scene_eplb_map=lambda ids: ids)  # identity replica map

class RunnerV2StandIn(v2_module.GPUModelRunner):
    @functools.wraps(inspect.unwrap(v2_module.GPUModelRunner.execute_model))
    def execute_model(self, scheduler_output, intermediate_tensors=None, dummy_run=False, skip_attn_for_dummy_run=False,
                      is_profile=False, context_len=0, valid_dummy_state_slots=False, randomize_inputs=False):
        n = scheduler_output.total_num_scheduled_tokens
        padded = -(-n // 8) * 8  # the graph size the batch pads to
        v2_module.dispatch_cg_and_sync_dp(None, 1, n, None, 2, 0, need_eager=True)  # as the real one calls it
        is_padding = self.input_buffers.is_padding[:padded]
        is_padding[:n].fill_(dummy_run and not is_profile)  # as the real dummy run: is_padding=not is_profile
        is_padding[n:].fill_(True)
        ids = torch.arange(padded * TOP_K).reshape(padded, TOP_K) % 8
        BaseRouter._apply_eplb_mapping(ROUTER_STANDIN, ids)

    @eplb_utils.step_eplb_after(is_dummy=True)
    def _dummy_run(self, num_tokens, *args, skip_eplb=False, is_profile=False, **kwargs):
        self.execute_model(SimpleNamespace(total_num_scheduled_tokens=num_tokens), dummy_run=True, is_profile=is_profile)

    @eplb_utils.step_eplb_after()
    def sample_tokens(self, grammar_output):
        return None

def flow(guarded):
    cls = type("RunnerV2StandIn", (RunnerV2StandIn,), {})
    if guarded:
        patches._patch_v2_step_start(cls)  # what install() does to the real V2 runner's execute_model
    runner = object.__new__(cls)
    controller = eplb_utils.EPLBController
    if not guarded:  # vLLM's own suppress(), without the plugin's discard on leaving it
        controller = type("EPLBController", (controller,), {"suppress": controller.suppress.__wrapped__})
    runner.eplb = controller(SimpleNamespace(enable_eplb=False), torch.device("cpu"))
    runner.input_buffers = SimpleNamespace(is_padding=torch.zeros(CAPACITY, dtype=torch.bool))
    obs = RoutingObserver(1, 8, 8, dp_size=2)
    rt = object.__new__(RecorderRuntime)
    rt.observer = obs
    runtime._current = rt
    ROUTER_STANDIN._scene_eplb_physical = functools.partial(obs.capture, 0, padding_rows=runtime.padding_rows_of(runner))
    obs.start()
    runner._dummy_run(16)  # a DP dummy step (a peer has work)
    runner._dummy_run(64, skip_eplb=True, is_profile=True)  # a skip_eplb warm-up: under suppress()
    with runner.eplb.suppress():  # the GPU worker's warm-up of real steps
        runner.execute_model(SimpleNamespace(total_num_scheduled_tokens=40))
        runner.sample_tokens(None)
    for n in (10, 5):
        runner.execute_model(SimpleNamespace(total_num_scheduled_tokens=n))
        runner.sample_tokens(None)
    obs.stop()
    runtime._current = runtime.NULL_RUNTIME
    rec, live = obs.snapshot(), obs.live_counts()
    return {
        "live": int(live.logical.sum()),
        "ring": int(rec.logical.sum()),
        "passes": rec.passes,
        "tokens": rec.tokens,
        "stamps": rec.stamps.tolist(),
        "signature": rec.signature.tolist(),
        "per_entry": rec.logical.sum(dim=(1, 2)).tolist(),
    }

print(json.dumps({"version": vllm.__version__, "guarded": flow(True), "unguarded": flow(False)}))
"""


@pytest.fixture(scope="module")
def result() -> dict:
    out = vllm033_env.run(SCRIPT)
    assert out["version"] == "0.33.0"
    return out


def test_only_real_passes_reach_the_counts(result):
    """Real steps of 10 and 5 tokens x top-2: 30 assignments; the dummy step's rows are padding."""
    g = result["guarded"]
    assert g["live"] == 30 and g["ring"] == 30 and g["passes"] == 2 and g["tokens"] == 15
    assert g["per_entry"] == [0, 20, 10]  # the dummy step advances the ring with nothing counted


def test_the_dp_vector_signs_each_real_step(result):
    assert result["guarded"]["signature"] == [[16, 7], [10, 7], [5, 7]]
    assert result["guarded"]["stamps"] == [0, 1, 2]


def test_without_the_step_start_the_warm_up_leaks_into_the_first_real_step(result):
    """The same flow without the guards (the V2 execute_model patch, the discard on leaving
    ``suppress()``): the skip_eplb warm-up's 128 assignments and the suppressed step's 80 are
    committed by the first real step."""
    u = result["unguarded"]
    assert u["live"] == 30 + 128 + 80 and u["per_entry"] == [0, 20 + 128 + 80, 10]
