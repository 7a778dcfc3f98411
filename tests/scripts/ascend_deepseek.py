"""One EP rank of the generated DeepSeek-V3 and DeepSeek-V4 through vLLM-Ascend 0.23.0.post1's real code
in one process (tests/ascend/test_vllm_ascend_deepseek.py): each model's layout loads
(tests/scripts/ascend_deepseek_load.py), with the MTP drafter, and V4's MoE forward of every layer (the
drafter's included).

Arguments: rank, world size, the rendezvous (``file://...``), a file that appears once the others are
written (the test makes them while this imports vLLM-Ascend), the dump folder; V3's float checkpoint,
its W8A8_DYNAMIC copy and its layout; V4's float checkpoint, W8A8_DYNAMIC copy, layout, the layout
fitted for ``dispatch: dynamic`` and the inputs file (``ids`` [N] token ids, -1 on padding rows, ``x``
[N, H] hidden states, ``real`` the real rows before the padding). V4's forwards: after its float load
with the layout, ``static``, and ``static_linear_log2phy`` (each layer's ``log2phy`` replaced by vLLM's
linear placement, the bug a wrong map makes); then the float model without a layout (a collection run:
``none``, and ``fallback``, the same with vLLM-Ascend's fused-gating check answering False, so its
``_native_select_experts`` runs and drops ``tid2eid``) and with the dynamic layout (``dynamic``). Prints
one JSON object: per model type, its loads' reports by case; for V4 also per forward the recorder's
counts of this rank [layer][expert] (the model's MoE layers, then the drafter's), whether the routing op was called with the hash table per layer,
the comm method, and per layer whether the output equals the run without a layout and by how much it
differs.

The forward runs vLLM-Ascend's real ``AscendFusedMoE.forward_impl`` (wrapped by the plugin) on each MoE
layer of the loaded model and of its MTP drafter, on the same hidden states, under its real ``set_ascend_forward_context``
carrying the token ids: the comm method's real ``prepare`` (padding and the TP split of the rows and of
the ids), the real ``select_experts`` (hooked by the plugin) and ``_select_experts_with_fusion_ops``, the
real ``MoECommMethod.fused_experts`` (``log2phy[topk_ids]``), the real ``unquant_apply_mlp``, the real
``finalize`` (the TP all-gather over Gloo). The router logits are the layer's float32 gate on the hidden
states (in the model's dtype), as ``AscendFusedMoE.shared_forward_impl`` computes them. Stand-ins,
beside ascend_deepseek_load.py's: the NPU kernels of tests/scripts/ascend_kernels.py
(``moe_gating_top_k_hash``, ``npu_grouped_matmul``, ``npu_swiglu``, the token dispatcher's dispatch and
combine).
"""

from __future__ import annotations

import json
import sys

import ascend_kernels
import torch
import torch_npu
from ascend_deepseek_load import layout_loads, load_case, start


def forward(runner, vc, inputs: dict, name: str) -> dict:
    """Every MoE layer's ``forward_impl`` on the inputs, the main model's then the MTP drafter's (under
    the drafter's forward context: ``is_draft_model``, its real rows told by ``num_actual_tokens``), in one
    recorded step with a drafter pass of no real rows after them (the context its ``dummy_run`` sets up):
    the counts (the drafter's rows after the model's), the routing op's calls, the outputs."""
    import vllm_ascend.ascend_forward_context as afc
    from vllm.config import set_current_vllm_config
    from vllm.distributed import get_ep_group
    from vllm_ascend.ops.fused_moe import moe_comm_method as mcm

    from vllm_scene_eplb.adapters.vllm_ascend import worker_plugin

    layers, drafter = worker_plugin.moe_layers(runner.model), worker_plugin.drafter_moe_layers(runner)
    dispatcher = ascend_kernels.EpDispatcher(get_ep_group().device_group, layers[0].local_num_experts)
    for comm in (afc.MoECommType.MC2, afc.MoECommType.ALLTOALL):
        mcm._MoECommMethods[comm].token_dispatcher = dispatcher
    rt = worker_plugin.current()
    assert isinstance(rt, worker_plugin.AscendWorkerPlugin)
    ids, x, real = inputs["ids"], inputs["x"].to(vc.model_config.dtype), int(inputs["real"])
    rt.answer("start")
    rt.begin_step(real)
    del ascend_kernels.HASH_CALLS[:]
    outs, comms = [], []
    for group, draft, actual in ((layers, False, real), (drafter, True, real), (drafter, True, 0)):
        with (
            set_current_vllm_config(vc),
            afc.set_ascend_forward_context(
                None, vc, num_tokens=ids.numel(), num_actual_tokens=actual, input_ids=ids, is_draft_model=draft
            ),
        ):
            comms.append(afc._EXTRA_CTX.moe_comm_type.name)
            for layer in group:
                logits = torch.nn.functional.linear(x.float(), layer.gate.weight_fp32)  # its gate as shared_forward_impl runs it
                out = layer.forward_impl(x, logits)
                if actual:
                    outs.append(out)
        if actual:
            hash_calls = [c["hash"] for c in ascend_kernels.HASH_CALLS]
    rt.end_step(False)
    rt.answer("stop")
    assert rt.drafter_observer is not None, "the MTP drafter's MoE layer is counted"
    counts = torch.cat([rt.observer.snapshot().logical.sum(dim=0), rt.drafter_observer.snapshot().logical.sum(dim=0)])
    return {
        "name": name,
        "comm": comms[0],
        "drafter_comm": comms[1],
        "drafter_layers": rt.drafter_layer_ids,
        "counts": counts.tolist(),
        "hash_calls": hash_calls,
        "bias_dtypes": [
            str(layer.e_score_correction_bias.dtype) for layer in layers if layer.e_score_correction_bias is not None
        ],
        "outputs": outs,
    }


def compared(run: dict, baseline: dict) -> dict:
    """A forward's wire form: its outputs against the baseline's, layer by layer."""
    out = {k: v for k, v in run.items() if k != "outputs"}
    pairs = list(zip(run["outputs"], baseline["outputs"]))
    out["equal_to_none"] = [bool(torch.equal(a, b)) for a, b in pairs]
    out["max_diff"] = [float((a - b).abs().max()) for a, b in pairs]
    out["norm"] = [float(a.norm()) for a in run["outputs"]]
    return out


def main() -> None:
    rank, world, init, ready, dump = int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:6]
    v3_float, v3_w8a8, v3_layout = sys.argv[6:9]
    v4_float, v4_w8a8, v4_layout, v4_dynamic, inputs_file = sys.argv[9:14]
    mr = start(ready)
    from safetensors.torch import load_file
    from vllm_ascend.ops.fused_moe import experts_selector

    out: dict = {"deepseek_v3": layout_loads(mr, (v3_float, v3_w8a8), v3_layout, dump, rank, world, init)}
    inputs = load_file(inputs_file)
    ascend_kernels.register_hash_op()
    torch_npu.npu_grouped_matmul = ascend_kernels.grouped_matmul
    torch_npu.npu_swiglu = ascend_kernels.swiglu
    runs = []

    def static(runner, vc) -> None:
        runs.append(forward(runner, vc, inputs, "static"))
        for layer in [*runner.model.modules(), *runner.drafter.model.modules()]:
            if getattr(layer, "log2phy", None) is not None:  # vLLM's linear placement: expert e in slot e
                layer.log2phy = torch.arange(layer.log2phy.numel(), dtype=layer.log2phy.dtype)
        runs.append(forward(runner, vc, inputs, "static_linear_log2phy"))

    v4 = layout_loads(mr, (v4_float, v4_w8a8), v4_layout, dump, rank, world, init, after_float=static)
    runner, vc, _ = load_case(mr, "float", v4_float, {"dump_dir": dump}, rank, world, init)
    baseline = forward(runner, vc, inputs, "none")
    check = experts_selector.check_npu_moe_gating_top_k
    experts_selector.check_npu_moe_gating_top_k = lambda **kwargs: False  # the fused op "not supported": the fallback
    runs.append(forward(runner, vc, inputs, "fallback"))
    experts_selector.check_npu_moe_gating_top_k = check
    scene_eplb = {"layout": v4_dynamic, "dump_dir": dump, "dispatch": "dynamic"}
    runner, vc, _ = load_case(mr, "float", v4_float, scene_eplb, rank, world, init)
    runs.append(forward(runner, vc, inputs, "dynamic"))
    v4["forward"] = {run["name"]: compared(run, baseline) for run in [baseline, *runs]}
    out["deepseek_v4"] = v4
    print(json.dumps(out))


if __name__ == "__main__":
    main()
