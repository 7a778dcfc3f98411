"""The recorder through vLLM-Ascend's real forward context, comm methods and quant methods (tests/ascend/test_vllm_ascend_recorder.py).

Arguments: the model folder and its number of experts. Prints one JSON list, a row per comm method x DP x TP x quant method."""

from __future__ import annotations

import itertools
import json
import sys
import zlib
from functools import partial
from types import SimpleNamespace
from typing import Any

import torch

import vllm_scene_eplb.adapters.entry as entry


def main() -> None:
    model, E = sys.argv[1], int(sys.argv[2])
    entry.register()  # the Ascend adapter, as in a worker
    import vllm_ascend.ascend_forward_context as afc
    from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config
    from vllm_ascend.ops.fused_moe import experts_selector
    from vllm_ascend.ops.fused_moe import moe_comm_method as mcm
    from vllm_ascend.ops.fused_moe import prepare_finalize as pf
    from vllm_ascend.ops.fused_moe.fused_moe import AscendUnquantizedFusedMoEMethod
    from vllm_ascend.quantization.methods.w8a8_dynamic import AscendW8A8DynamicFusedMoEMethod

    from vllm_scene_eplb.adapters.vllm_ascend import moe_hooks
    from vllm_scene_eplb.adapters.vllm_ascend.rows import OwnRows
    from vllm_scene_eplb.adapters.vllm_ascend.worker_plugin import CAPTURE_ATTR, AscendWorkerPlugin, _capture
    from vllm_scene_eplb.runtime.worker.observer import RoutingObserver

    K, H = 2, 16
    REAL = {0: [5, 3], 1: [2, 6]}  # real tokens per DP rank, for tp = 1 and 2
    PADDED = {0: [8, 4], 1: [4, 8]}  # the batch each DP rank runs (graph padding)
    vc = VllmConfig(model_config=ModelConfig(model=model))
    afc.set_mc2_mask(vc, "cpu")
    select = experts_selector.select_experts.__scene_eplb_original__
    ROUTE = dict(top_k=K, use_grouped_topk=False, renormalize=False, scoring_func="sigmoid")  # the plain-torch path

    class FusedExpertsStandIn:  # NPU kernels from here on: keep the ids, return zeros
        def fused_experts(self, fused_experts_input):
            self.ids = fused_experts_input.topk_ids
            return torch.zeros_like(fused_experts_input.hidden_states)

    def method(kind):
        if kind == "unquantized":
            m = object.__new__(AscendUnquantizedFusedMoEMethod)
            m.tid2eid, m.dynamic_eplb, m.moe = None, False, SimpleNamespace(has_bias=False)
            return m, {}, E
        m = object.__new__(AscendW8A8DynamicFusedMoEMethod)
        m.multistream_overlap_gate, m.dynamic_eplb, m.in_dtype = False, False, torch.float32
        return m, {"mix_placement": True, "n_shared_experts": 1}, E + 1  # the shared expert placed as expert E

    results = []
    for comm, (dp, tp), kind in itertools.product(
        ["MC2", "ALLTOALL", "ALLGATHER"], [(1, 1), (1, 2), (2, 1), (2, 2)], ["unquantized", "w8a8_dynamic"]
    ):
        # the same every process (hash() is salted)
        g = torch.Generator().manual_seed(zlib.crc32(repr((comm, dp, tp, kind)).encode()))
        real, padded = [REAL[d][tp - 1] for d in range(dp)], [PADDED[d][tp - 1] for d in range(dp)]
        batches = [(torch.randn(n, H, generator=g), torch.randn(n, E, generator=g)) for n in padded]
        want = torch.zeros(E, dtype=torch.int64)  # the real tokens' ids, from the real select_experts
        for d in range(dp):
            ids = select(hidden_states=batches[d][0][: real[d]], router_logits=batches[d][1][: real[d]], **ROUTE)[1]
            want += torch.bincount(ids.flatten().to(torch.int64), minlength=E)
        mx = max(padded)
        gathered = [torch.cat([torch.nn.functional.pad(b[i], (0, 0, 0, mx - b[i].shape[0])) for b in batches]) for i in (0, 1)]
        got = torch.zeros(E, dtype=torch.int64)
        for d, t in itertools.product(range(dp), range(tp)):
            observer = RoutingObserver(1, E, 4)
            observer.start()
            own = OwnRows(tp_rank=t, tp_size=tp, dp_rank=d, dp_size=dp)
            m, extra, num_experts = method(kind)
            layer = SimpleNamespace(
                w13_weight=torch.zeros(1),
                w2_weight=torch.zeros(1),
                w13_weight_scale_fp32=torch.ones(1),
                w2_weight_scale=torch.ones(1),
                swiglu_limit=0.0,
                layer_id=0,
                vllm_config=vc,
                **extra,
            )
            rt: Any = SimpleNamespace(own_rows=own, _pass_comm=None)  # the runtime's parts _capture reads
            rt.note_comm = partial(AscendWorkerPlugin.note_comm, rt)
            layer.__dict__[CAPTURE_ATTR] = partial(_capture, rt, observer, 0)  # what AscendWorkerPlugin.bind installs
            standin = FusedExpertsStandIn()
            afc.get_dp_group = lambda: SimpleNamespace(world_size=dp)
            afc.get_tensor_model_parallel_world_size = lambda: tp
            afc.select_moe_comm_method = lambda *a, **k: afc.MoECommType[comm]
            mcm._MoECommMethods[afc.MoECommType[comm]] = standin  # their registry of comm methods
            pf.get_tensor_model_parallel_world_size, pf.get_tensor_model_parallel_rank = (lambda: tp), (lambda: t)
            gather = SimpleNamespace(all_gather=lambda x, dim, _g=gathered: _g[0] if x.shape[-1] == H else _g[1])
            moe_config = SimpleNamespace(dp_size=dp, dp_group=gather, pcp_size=1, tp_group=None)
            cls = {
                "MC2": pf.PrepareAndFinalizeWithMC2,
                "ALLTOALL": pf.PrepareAndFinalizeWithAll2All,
                "ALLGATHER": pf.PrepareAndFinalizeWithAllGather,
            }[comm]
            prepare = cls.__new__(cls)
            prepare.moe_config, prepare.multistream_overlap_gate = moe_config, False
            if comm != "ALLGATHER":
                prepare._restore_tp_across_dp()
            with set_current_vllm_config(vc):
                vc.parallel_config.data_parallel_size, vc.parallel_config.data_parallel_rank = dp, d
                across = torch.tensor(padded, dtype=torch.int32) if dp > 1 else None
                with afc.set_ascend_forward_context(
                    None, vc, num_tokens=padded[d], num_tokens_across_dp=across, num_actual_tokens=real[d]
                ):
                    out = prepare.prepare(batches[d][0], batches[d][1])
                    token = moe_hooks.current_layer.set(layer)  # what the wrapped AscendFusedMoE.forward_impl does
                    try:
                        m.apply(layer, out.hidden_states, router_logits=out.router_logits, num_experts=num_experts, **ROUTE)
                    finally:
                        moe_hooks.current_layer.reset(token)
            observer.end_step()  # the step boundary: commit this pass
            observer.stop()
            got += observer.snapshot().logical.sum(dim=(0, 1)).to(torch.int64)
            pseudo = int((standin.ids >= E).sum())
            seen = rt._pass_comm  # the comm method the runtime read from the forward context
        results.append(
            {
                "comm": comm,
                "seen": seen,
                "dp": dp,
                "tp": tp,
                "kind": kind,
                "want": want.tolist(),
                "got": got.tolist(),
                "pseudo_ids_seen": pseudo,
                "padding_rows": sum(padded) - sum(real),
            }
        )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
