"""Dynamic dispatch through every module's real select_experts and vLLM-Ascend's own log2phy (tests/ascend/test_vllm_ascend_moe.py).

Arguments: the model folder, the layout file, the dump folder, experts, EP size, MoE layers. Prints one JSON list."""

from __future__ import annotations

import importlib
import json
import sys
from types import SimpleNamespace

import torch

import vllm_scene_eplb.adapters.entry as entry


def main() -> None:
    model, layout, dump = sys.argv[1:4]
    E, ep, n_moe = (int(a) for a in sys.argv[4:7])
    entry.register()  # the Ascend adapter: config hook, log2phy maps, MoE hooks
    from vllm.config import ModelConfig, ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm_ascend.ascend_config import EplbConfig
    from vllm_ascend.eplb.core import eplb_utils as eu

    from vllm_scene_eplb.adapters.vllm_ascend import moe_hooks

    torch.Tensor.npu = lambda self: self  # type: ignore[attr-defined]  # no NPU here: their code moves log2phy to it
    vc = VllmConfig(
        model_config=ModelConfig(model=model),
        parallel_config=ParallelConfig(tensor_parallel_size=2, enable_expert_parallel=True),
        additional_config={"scene_eplb": {"layout": layout, "dump_dir": dump, "dispatch": "dynamic"}},
    )
    ec = EplbConfig(vc.additional_config["eplb_config"])
    torch.manual_seed(0)
    x, logits = torch.randn(37, 16), torch.randn(37, E)
    route = dict(top_k=2, use_grouped_topk=False, renormalize=False, scoring_func="sigmoid")  # the plain-torch path
    out = []
    with set_current_vllm_config(vc):
        for k in range(n_moe):
            for r in range(ep):
                g, _, log2phy, _ = eu.init_eplb_config(ec, k, SimpleNamespace(num_experts=E, ep_size=ep, ep_rank=r), tp_size=2)
                layer = SimpleNamespace(log2phy=log2phy, global_expert_map=g)  # the attributes AscendFusedMoE holds
                for name in moe_hooks.SELECT_EXPERTS_BINDERS:
                    select = importlib.import_module(name).select_experts
                    w0, ids0 = select.__scene_eplb_original__(hidden_states=x, router_logits=logits, **route)
                    outside = select(hidden_states=x, router_logits=logits, **route)[1]
                    token = moe_hooks.current_layer.set(layer)
                    try:
                        w1, ids1 = select(hidden_states=x, router_logits=logits, **route)
                    finally:
                        moe_hooks.current_layer.reset(token)
                    phys = log2phy[ids1]  # what MoECommMethod.fused_experts does with them
                    out.append(
                        {
                            "k": k,
                            "rank": r,
                            "module": name,
                            "log2phy_len": log2phy.numel(),
                            "same_weights": bool(torch.equal(w0, w1)),
                            "outside_unchanged": bool(torch.equal(outside, ids0)),
                            "logical": ids0.tolist(),
                            "phys": phys.tolist(),
                        }
                    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
