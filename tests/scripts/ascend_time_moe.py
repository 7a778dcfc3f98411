"""time_moe on vLLM-Ascend through its real forward and ALLTOALL fused_experts (tests/ascend/test_vllm_ascend_time.py).

Arguments: the model folder and its number of experts. Prints one JSON object."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import torch
import torch_npu
from ascend_worker import prefill_plugin

import vllm_scene_eplb.adapters.entry as entry


def main() -> None:
    model_dir, E = sys.argv[1], int(sys.argv[2])
    entry.register()
    import vllm_ascend.ascend_forward_context as afc
    from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config
    from vllm_ascend.ascend_config import init_ascend_config
    from vllm_ascend.ops.fused_moe import moe_comm_method as mcm
    from vllm_ascend.ops.fused_moe.fused_moe import AscendUnquantizedFusedMoEMethod
    from vllm_ascend.ops.fused_moe.moe_stage_contracts import MoETokenDispatchOutput

    from vllm_scene_eplb.adapters.vllm_ascend import moe_hooks, moe_time
    from vllm_scene_eplb.adapters.vllm_ascend.worker_plugin import CAPTURE_ATTR, _capture
    from vllm_scene_eplb.errors import SceneEplbError
    from vllm_scene_eplb.live.fitness import LiveFitness
    from vllm_scene_eplb.protocol import RankLiveAnswer, WorkerAnswer
    from vllm_scene_eplb.runtime.server.live_poller import live_sample

    H = 16
    events = torch_npu.EVENTS
    vc = VllmConfig(model_config=ModelConfig(model=model_dir))
    afc.set_mc2_mask(vc, "cpu")
    afc.get_dp_group = lambda: SimpleNamespace(world_size=1)  # stand-ins for the groups
    afc.get_tensor_model_parallel_world_size = lambda: 1
    afc.select_moe_comm_method = lambda *a, **k: afc.MoECommType.ALLTOALL

    class TokenDispatcherStandIn:  # the NPU dispatch and combine kernels
        def token_dispatch(self, token_dispatch_input):
            x = token_dispatch_input.hidden_states
            return MoETokenDispatchOutput(
                hidden_states=x, group_list=torch.tensor([x.shape[0]]), group_list_type=1, combine_metadata=None
            )

        def token_combine(self, hidden_states, combine_metadata):
            return hidden_states

    def mlp_standin(mlp_compute_input):  # the grouped-matmul kernels: plain torch work
        x = mlp_compute_input.hidden_states
        for _ in range(20):
            x = torch.tanh(x @ mlp_compute_input.weights.w1[0][:H, :H])
        return x, None

    mcm.unified_apply_mlp = mlp_standin
    comm = object.__new__(mcm.AlltoAllCommImpl)  # the real class and its real fused_experts
    comm.token_dispatcher, comm.use_fusion_ops = TokenDispatcherStandIn(), False
    mcm._MoECommMethods[afc.MoECommType.ALLTOALL] = comm

    extra = {"scene_eplb": {"role": "prefill", "ring_entries": 4, "time_moe": True}}
    rt = prefill_plugin(extra, model_dir)
    model = rt.model
    layers = [
        SimpleNamespace(
            w13_weight=torch.randn(1, 2 * H, H), w2_weight=torch.randn(1, H, H), layer_id=i, vllm_config=vc, swiglu_limit=0.0
        )
        for i in range(len(model.moe_layers))
    ]
    for idx, layer in enumerate(layers):  # what AscendWorkerPlugin.bind does: the counts, and with time_moe
        layer.__dict__[CAPTURE_ATTR] = lambda ids, idx=idx: _capture(rt, rt.observer, idx, ids)
    moe_time.install()
    rt.timer = moe_time.MoeTimer()
    moe_time.bind(rt.timer, layers)
    m = object.__new__(AscendUnquantizedFusedMoEMethod)
    m.tid2eid, m.dynamic_eplb, m.moe = None, False, SimpleNamespace(has_bias=False)

    def step(capturing=False):
        events.capturing = capturing
        rt.begin_step(8)
        x, logits = torch.randn(8, H), torch.randn(8, E)
        with set_current_vllm_config(vc), afc.set_ascend_forward_context(None, vc, num_tokens=8, num_actual_tokens=8):
            events.in_forward = True  # any synchronize from here on fails
            for layer in layers:
                token = moe_hooks.current_layer.set(layer)  # what the wrapped AscendFusedMoE.forward_impl does
                try:
                    m.apply(
                        layer,
                        x,
                        use_grouped_topk=False,
                        top_k=2,
                        router_logits=logits,
                        renormalize=False,
                        scoring_func="sigmoid",
                        num_experts=E,
                    )  # the plain-torch routing path
                finally:
                    moe_hooks.current_layer.reset(token)
            events.in_forward = False
        rt.end_step(False)
        events.capturing = False

    out = {}
    step()
    out["after_one"] = rt.control("live")["moe_seconds"]
    step()
    step(capturing=True)  # a graph capture: no events recorded
    out["records"] = events.calls.count("record")
    step()
    answer = rt.control("live")
    out["live"] = {k: answer[k] for k in ("moe_seconds", "moe_passes", "steps", "step_seconds", "step_moe_seconds")}
    live = LiveFitness.for_server(None, E, 1, None, tuple(model.moe_layers), margin=0.05, windows=3)
    rank = WorkerAnswer.from_wire(answer, RankLiveAnswer.from_wire).payload
    assert rank is not None, answer
    live.observe(live_sample([rank]), 1.0)
    out["time"] = live.to_wire()["time"]
    out["comm_seen"] = rt.comm_seen
    out["syncs"] = events.calls.count("Event.synchronize")
    fused = VllmConfig(model_config=ModelConfig(model=model_dir), additional_config={"enable_fused_mc2": 1, "refresh": True})
    try:
        moe_time.refuse_fused_mc2(init_ascend_config(fused))
        out["fused"] = "accepted"
    except SceneEplbError as exc:
        out["fused"] = str(exc)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
