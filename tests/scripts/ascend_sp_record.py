"""The recorder under vLLM-Ascend's V4-Flash P settings (FlashComm1, DSA-CP, shared-expert DP),
through its released sequence-parallel padding and split code (tests/ascend/test_vllm_ascend_sp_record.py).

Arguments: a tiny DeepSeek-V4 model folder. Prints one JSON list, a row per setting x comm method x
DP x TP x layer kind (hash-routed by token id, or score-routed).

Per DP rank the runner's real ``_pad_for_sequence_parallelism`` pads the batch to a multiple of TP
(and, as its DP sync does under SP, every DP rank to the largest: the stand-in below); vLLM-Ascend's
real ``set_ascend_forward_context`` sets FlashComm1's pad size, ``mc2_mask`` and the step's token ids
(the padding rows' ids stale, as the runner's buffer leaves them). Each TP rank's chunk of the batch
is what the released code makes it: FlashComm1 / shared-expert DP, the row-parallel output's real
``maybe_pad_and_reduce`` (pad, then TP reduce-scatter); DSA-CP, the real ``_build_local_token_metadata``
token split. The comm method's real ``prepare`` runs with the arguments ``AscendFusedMoE.forward_impl``
passes (``replace_allreduce`` = FlashComm1 on, ``enable_shared_expert_dp`` from the real ascend config),
then the unquantized method's real ``apply`` and ``select_experts``, whose real fused-op path splits
the hash layer's token ids over TP under FlashComm1.

Stand-ins, beside ``torch_npu``: the group sizes and ranks the code reads, the DP sync's padding to
the largest DP rank, the TP reduce-scatter (this rank's chunk), the forced comm method and its
``fused_experts``, and the NPU kernel ``torch.ops._C_ascend.moe_gating_top_k_hash``
(``moe_gating_top_k_hash_standin``: ids from ``tid2eid[input_ids]`` on a hash layer, else the top-k
of sqrt(softplus(logits)) + bias)."""

from __future__ import annotations

import itertools
import json
import sys
import zlib
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from ascend_dp_steps import runner_module  # this folder: the model runner imported as its test imports it

SETTINGS = {
    "flashcomm1": {"enable_flashcomm1": True},
    "dsa_cp": {"enable_flashcomm1": True, "enable_dsa_cp": True},
    "shared_expert_dp": {"enable_shared_expert_dp": True},
}
REAL = {(1, 4): [13], (2, 2): [7, 3], (2, 4): [2, 9]}  # real tokens per DP rank: none a multiple of TP


def moe_gating_top_k_hash_standin(x, k, bias=None, input_ids=None, tid2eid=None, **_):
    """STAND-IN for the NPU kernel ``torch.ops._C_ascend.moe_gating_top_k_hash`` (V4 routing)."""
    scores = torch.sqrt(torch.nn.functional.softplus(x.float()))
    if tid2eid is not None:
        ids = tid2eid[input_ids.long()].to(torch.int32)
    else:
        ids = torch.topk(scores + (0 if bias is None else bias), k, dim=-1).indices.to(torch.int32)
    return scores.gather(1, ids.long()), ids, scores


def main() -> None:
    model = sys.argv[1]
    NPUModelRunner = runner_module().NPUModelRunner  # with the plugin registered, as in a worker
    import vllm_ascend.ascend_forward_context as afc
    from vllm.config import ModelConfig, ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm_ascend.ascend_config import clear_ascend_config, get_ascend_config
    from vllm_ascend.attention.context_parallel import dsa_cp
    from vllm_ascend.ops import register_custom_ops as rco
    from vllm_ascend.ops.fused_moe import experts_selector
    from vllm_ascend.ops.fused_moe import moe_comm_method as mcm
    from vllm_ascend.ops.fused_moe import prepare_finalize as pf
    from vllm_ascend.ops.fused_moe.fused_moe import AscendUnquantizedFusedMoEMethod
    from vllm_ascend.utils import enable_dsa_cp, enable_sp

    from vllm_scene_eplb.adapters.vllm_ascend import moe_hooks
    from vllm_scene_eplb.adapters.vllm_ascend.rows import OwnRows
    from vllm_scene_eplb.adapters.vllm_ascend.worker_plugin import CAPTURE_ATTR, AscendWorkerPlugin, _capture
    from vllm_scene_eplb.runtime.worker.observer import RoutingObserver

    torch.ops._C_ascend.moe_gating_top_k_hash = moe_gating_top_k_hash_standin  # type: ignore[attr-defined]  # the NPU kernel
    cfg = json.loads((Path(model) / "config.json").read_text())
    E, K, H, V = cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["hidden_size"], cfg["vocab_size"]
    ROUTE = dict(top_k=K, use_grouped_topk=True, renormalize=True, topk_group=1, num_expert_group=1, scoring_func="sqrtsoftplus")

    class FusedExpertsStandIn:  # the comm method: its real input-id split over its prepare; NPU kernels from there: zeros
        def __init__(self, comm, prepare_finalize):
            impl = mcm.MC2CommImpl if comm == "MC2" else mcm.AlltoAllCommImpl
            self.prepare_finalize, self.pad_and_split_input_ids = prepare_finalize, partial(impl.pad_and_split_input_ids, self)

        def fused_experts(self, fused_experts_input):
            return torch.zeros_like(fused_experts_input.hidden_states)

    results = []
    for setting, comm, (dp, tp), kind in itertools.product(SETTINGS, ["MC2", "ALLTOALL"], REAL, ["hash", "score"]):
        g = torch.Generator().manual_seed(zlib.crc32(repr((setting, comm, dp, tp, kind)).encode()))
        clear_ascend_config()  # vLLM-Ascend's own reset of its config, enable_sp() and enable_dsa_cp()
        vc = VllmConfig(
            model_config=ModelConfig(model=model),
            additional_config=dict(SETTINGS[setting]),
            parallel_config=ParallelConfig(tensor_parallel_size=tp, enable_expert_parallel=True),
        )
        afc._reserved_mc2_mask = None
        afc.set_mc2_mask(vc, "cpu")
        runner = SimpleNamespace(vllm_config=vc)  # what _pad_for_sequence_parallelism reads
        real = REAL[(dp, tp)]
        padded = max(NPUModelRunner._pad_for_sequence_parallelism(runner, n) for n in real)  # DP sync stand-in: the largest
        gate = torch.randn(E, H, generator=g)
        bias = torch.randn(E, generator=g) if kind == "score" else None
        tid2eid = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(V)]).to(torch.int32) if kind == "hash" else None
        batches = [(torch.randn(padded, H, generator=g), torch.randint(0, V, (padded,), generator=g)) for _ in real]
        want = torch.zeros(E, dtype=torch.int64)  # the real tokens' experts
        for d, n in enumerate(real):
            x, ids_in = batches[d][0][:n], batches[d][1][:n]
            ids = moe_gating_top_k_hash_standin(x @ gate.T, K, bias, ids_in, tid2eid)[1]
            want += torch.bincount(ids.flatten().long(), minlength=E)
        got, skipped = torch.zeros(E, dtype=torch.int64), 0
        seen: dict[str, Any] = {}
        for d, t in itertools.product(range(dp), range(tp)):
            observer = RoutingObserver(1, E, 4)
            observer.start()
            m = object.__new__(AscendUnquantizedFusedMoEMethod)
            m.tid2eid, m.dynamic_eplb, m.moe = tid2eid, False, SimpleNamespace(has_bias=False)
            layer = SimpleNamespace(
                layer_id=0, vllm_config=vc, w13_weight=torch.zeros(1), w2_weight=torch.zeros(1), swiglu_limit=10.0
            )
            rt: Any = SimpleNamespace(own_rows=OwnRows(tp_rank=t, tp_size=tp, dp_rank=d, dp_size=dp), _pass_comm=None)
            rt.note_comm = partial(AscendWorkerPlugin.note_comm, rt)
            layer.__dict__[CAPTURE_ATTR] = partial(_capture, rt, observer, 0)  # what AscendWorkerPlugin.bind installs
            group = SimpleNamespace(world_size=tp, rank_in_group=t)
            afc.get_dp_group = lambda: SimpleNamespace(world_size=dp)
            afc.get_tensor_model_parallel_world_size = lambda: tp
            afc.select_moe_comm_method = lambda *a, **k: afc.MoECommType[comm]
            pf.get_tensor_model_parallel_world_size, pf.get_tensor_model_parallel_rank = (lambda: tp), (lambda: t)
            experts_selector.get_tp_group = dsa_cp.get_tp_group = lambda: group
            rco.tensor_model_parallel_reduce_scatter = lambda x, dim=0: torch.tensor_split(x, tp, dim)[t]
            cls = pf.PrepareAndFinalizeWithMC2 if comm == "MC2" else pf.PrepareAndFinalizeWithAll2All
            prepare = cls.__new__(cls)
            prepare.moe_config, prepare.multistream_overlap_gate = SimpleNamespace(dp_size=dp, pcp_size=1), False
            prepare._restore_tp_across_dp()
            mcm._MoECommMethods[afc.MoECommType[comm]] = FusedExpertsStandIn(comm, prepare)  # their registry
            hidden, input_ids = batches[d]
            with set_current_vllm_config(vc):
                vc.parallel_config.data_parallel_size, vc.parallel_config.data_parallel_rank = dp, d
                across = torch.tensor([padded] * dp, dtype=torch.int32) if dp > 1 else None
                with afc.set_ascend_forward_context(
                    None, vc, num_tokens=padded, num_tokens_across_dp=across, num_actual_tokens=real[d], input_ids=input_ids
                ):
                    fc = afc._EXTRA_CTX
                    if enable_dsa_cp():  # DSA-CP: its attention's token split, which the MoE layer then holds
                        lo, hi = dsa_cp.AscendDSACPMetadataBuilder._build_local_token_metadata(
                            None, 1, padded, None, torch.tensor([0, padded]), torch.tensor([padded]), False
                        )[:2]
                        chunk = hidden[lo:hi]
                    else:  # the row-parallel output under FlashComm1: pad, reduce-scatter over TP
                        chunk = rco._maybe_pad_and_reduce_impl(hidden)
                    out = prepare.prepare(
                        chunk,
                        chunk @ gate.T,
                        replace_allreduce=fc.flash_comm_v1_enabled,
                        enable_shared_expert_dp=get_ascend_config().enable_shared_expert_dp,
                    )
                    seen = {
                        "sp": [enable_sp(vc), enable_dsa_cp(), bool(get_ascend_config().enable_shared_expert_dp)],
                        "flash_comm_v1": bool(fc.flash_comm_v1_enabled),
                    }
                    token = moe_hooks.current_layer.set(layer)  # what the wrapped AscendFusedMoE.forward_impl does
                    try:
                        m.apply(
                            layer,
                            out.hidden_states,
                            router_logits=out.router_logits,
                            num_experts=E,
                            e_score_correction_bias=bias,
                            **ROUTE,
                        )
                    finally:
                        moe_hooks.current_layer.reset(token)
            observer.end_step()  # the step boundary: commit this pass
            observer.stop()
            got += observer.snapshot().logical.sum(dim=(0, 1)).to(torch.int64)
            skipped += observer.status().skipped_passes
        results.append(
            {
                "setting": setting,
                "comm": comm,
                "dp": dp,
                "tp": tp,
                "kind": kind,
                "want": want.tolist(),
                "got": got.tolist(),
                "padding_rows": padded * dp - sum(real),
                "skipped": skipped,
                **seen,
            }
        )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
