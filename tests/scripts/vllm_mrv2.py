"""Model Runner V2 of vLLM 0.33 driving the observer, with and without the plugin's guards (tests/engine/test_vllm_mrv2.py).

Prints one JSON object."""

from __future__ import annotations

import functools
import inspect
import json
import os
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import vllm

from vllm_scene_eplb.adapters.vllm import patches, register, worker_plugin
from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.layouts.layout import Geometry, Layout
from vllm_scene_eplb.runtime.worker.observer import RoutingObserver
from vllm_scene_eplb.runtime.worker.replica_map import layer_maps
from vllm_scene_eplb.runtime.worker.worker import RecorderPlugin


def main() -> None:
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
        def execute_model(
            self,
            scheduler_output,
            intermediate_tensors=None,
            dummy_run=False,
            skip_attn_for_dummy_run=False,
            is_profile=False,
            context_len=0,
            valid_dummy_state_slots=False,
            randomize_inputs=False,
        ):
            n = scheduler_output.total_num_scheduled_tokens
            padded = -(-n // 8) * 8  # the graph size the batch pads to
            v2_module.dispatch_cg_and_sync_dp(None, 1, n, None, 2, 0, need_eager=True)  # as the real one calls it
            is_padding = self.input_buffers.is_padding[:padded]
            is_padding[:n].fill_(dummy_run and not is_profile)  # as the real dummy run: is_padding=not is_profile
            is_padding[n:].fill_(True)
            ids = torch.arange(padded * TOP_K).reshape(padded, TOP_K) % 8
            ids[is_padding] = -1  # as 0.33's top-k writes padding rows under VLLM_MOE_SKIP_PADDING=1 (its default)
            BaseRouter._apply_eplb_mapping(ROUTER_STANDIN, ids)

        @eplb_utils.step_eplb_after(is_dummy=True)
        def _dummy_run(self, num_tokens, *args, skip_eplb=False, is_profile=False, **kwargs):
            so = SimpleNamespace(total_num_scheduled_tokens=num_tokens)
            self.execute_model(so, dummy_run=True, is_profile=is_profile)  # type: ignore[call-arg, arg-type]  # functools.wraps hides the bound self from mypy

        @eplb_utils.step_eplb_after()
        def sample_tokens(self, grammar_output):
            return None

    def flow(guarded):
        cls: Any = type("RunnerV2StandIn", (RunnerV2StandIn,), {})
        if guarded:
            patches._patch_v2_step_start(cls)  # what install() does to the real V2 runner's execute_model
        runner: Any = object.__new__(cls)
        controller = eplb_utils.EPLBController
        if not guarded:  # vLLM's own suppress(), without the plugin's discard on leaving it
            controller = type("EPLBController", (controller,), {"suppress": controller.suppress.__wrapped__})
        runner.eplb = controller(SimpleNamespace(enable_eplb=False), torch.device("cpu"))
        runner.input_buffers = SimpleNamespace(is_padding=torch.zeros(CAPACITY, dtype=torch.bool))
        obs = RoutingObserver(1, 8, 8, dp_size=2)
        rt: Any = object.__new__(RecorderPlugin)  # a runtime with only its observer
        rt.observer = obs
        worker_plugin._current = rt
        ROUTER_STANDIN._scene_eplb_physical = functools.partial(
            obs.capture, 0, padding_rows=worker_plugin.padding_rows_of(runner)
        )
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
        worker_plugin._current = worker_plugin.NULL_PLUGIN
        rec, live = obs.snapshot(), obs.live_counts()
        assert live is not None and rec.signature is not None  # observing, with DP: both are kept
        return {
            "live": int(live.logical.sum()),
            "ring": int(rec.logical.sum()),
            "passes": rec.passes,
            "tokens": rec.tokens,
            "stamps": rec.stamps.tolist(),
            "signature": rec.signature.tolist(),
            "per_entry": rec.logical.sum(dim=(1, 2)).tolist(),
        }

    def sentinels():
        """One real step of 10 tokens (padded to 16) under a layout (8 experts + 2 redundant slots over
        EP 2, static) with no padding mask: the slots the capture sees on the padding rows, and the counts."""
        layout = Layout(np.array([[0, 1, 2, 3, 7, 4, 5, 6, 0, 7]]), Geometry(8, 2, 2))
        ROUTER_STANDIN._scene_eplb_map = layer_maps(layout, "static")[0]
        obs = RoutingObserver(1, 8, 2, slot_to_expert=torch.from_numpy(layout.physical_to_logical_map))
        seen = []

        def capture(slots):  # the slots the router hands the capture, then counted with no padding mask
            seen.append(slots)
            obs.capture(0, slots)

        ROUTER_STANDIN._scene_eplb_physical = capture
        runner: Any = object.__new__(RunnerV2StandIn)
        runner.input_buffers = SimpleNamespace(is_padding=torch.zeros(CAPACITY, dtype=torch.bool))
        runner.execute_model(SimpleNamespace(total_num_scheduled_tokens=10))
        obs.end_step()
        live = obs.live_counts()
        assert live is not None and live.physical is not None  # observing slot ids
        return {"padding_slots": sorted(set(seen[0][10:].flatten().tolist())), "physical": int(live.physical.sum())}

    def padding_flag():
        """The patched V2 ``load_model`` under each VLLM_MOE_SKIP_PADDING, with the flag and without:
        the refusal, or "loads" where it reaches the plugin's configure (a stand-in that stops there)."""

        class ConfigureReached(Exception):
            pass

        def configure_standin(vllm_config, drafter=None):
            raise ConfigureReached

        worker_plugin.configure = configure_standin
        out = {}
        for flag in (True, False):
            for skip in ("0", "1"):
                os.environ["VLLM_MOE_SKIP_PADDING"] = skip
                runner: Any = object.__new__(v2_module.GPUModelRunner)
                runner.vllm_config = SimpleNamespace(additional_config={"scene_eplb": {}} if flag else {})
                try:
                    runner.load_model()
                except ConfigureReached:
                    out[f"flag={flag} skip={skip}"] = "loads"
                except SceneEplbError as exc:
                    out[f"flag={flag} skip={skip}"] = str(exc)
        return out

    print(
        json.dumps(
            {
                "version": vllm.__version__,
                "guarded": flow(True),
                "unguarded": flow(False),
                "sentinels": sentinels(),
                "padding_flag": padding_flag(),
            }
        )
    )


if __name__ == "__main__":
    main()
