"""Sequence-parallel MoE counted chunk by chunk, through vLLM 0.33's released Python (tests/engine/test_vllm_sp_counts.py).

Every TP rank of one DP rank is played in turn in this process: the plugin binds to a model whose MoE
layers are vLLM's real ``MoERunner`` class, the steps run through the real sharding code (DeepSeek-V4's
``DeepseekV4Model.forward``: ``sp_padding_mask``, ``sp_shard`` of hidden states and input ids; a MoE
block's ``sequence_parallel_chunk``: ``Qwen3MoeSparseMoeBlock.forward``), the padding mask is the V1
runner's real ``_prepare_padding_mask`` in a real forward context, and the shard decision is vLLM's own
(``_use_sequence_parallel``, ``ParallelConfig.use_sequence_parallel_moe``) on real configs, both ways.

Prints one JSON object."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace
from typing import Any

import torch
import vllm
from torch import nn

from vllm_scene_eplb.adapters.vllm import register, worker_plugin
from vllm_scene_eplb.adapters.vllm.worker_plugin import VllmWorkerPlugin
from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.planning.model_geometry import ModelGeometry
from vllm_scene_eplb.runtime.config import parse_config
from vllm_scene_eplb.runtime.worker.export import Exporter
from vllm_scene_eplb.runtime.worker.observer import NullObserver
from vllm_scene_eplb.runtime.worker.replica_map import SourceRanks

TP, DP, EXPERTS, TOP_K, VOCAB, HIDDEN, LAYERS = 4, 2, 8, 2, 64, 16, 2
# (real tokens, rows the runner pads the step to): graph padding, a one-token decode step, a chunk
# that ends inside the step, ranks whose chunk is all padding
STEPS = [(5, 8), (1, 1), (7, 7), (3, 4), (2, 8), (9, 12), (6, 6)]
MAX_TOKENS = 16


def main() -> None:
    register()
    from vllm.config import ParallelConfig
    from vllm.config.kernel import KernelConfig
    from vllm.distributed import parallel_state
    from vllm.forward_context import create_forward_context, override_forward_context
    from vllm.model_executor.layers.fused_moe.router import fused_topk_bias_router
    from vllm.model_executor.layers.fused_moe.router.base_router import BaseRouter
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod
    from vllm.model_executor.models.qwen3_moe import Qwen3MoeSparseMoeBlock
    from vllm.models.deepseek_v4.nvidia import model as v4
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    torch.manual_seed(0)
    embed = torch.randn(VOCAB, HIDDEN)
    gates = [torch.randn(HIDDEN, EXPERTS) for _ in range(LAYERS)]
    tid2eid = torch.stack([torch.randperm(EXPERTS)[:TOP_K] for _ in range(VOCAB)]).to(torch.int32)  # V4's hash table
    input_ids = torch.randint(1, VOCAB, (MAX_TOKENS,))

    class TPGroupStandIn:  # vLLM's TP group of TP ranks, this process playing rank ``rank_in_group``
        device_communicator = None

        def __init__(self, rank: int):
            self.world_size, self.rank_in_group = TP, rank

        def all_gather(self, x, dim=0):  # the peers' chunks: this rank's again (the MoE output is not checked)
            return torch.cat([x] * TP, dim)

    parallel_state._PP = SimpleNamespace(is_first_rank=True, is_last_rank=True, world_size=1)  # PP group stand-in: PP=1
    # the tilelang CUDA kernels around V4's layers, stand-ins that pass the hidden states through
    v4.mhc_post_tilelang = lambda hidden, residual, post_mix, res_mix: hidden
    v4.hc_head_fused_kernel_tilelang = lambda hidden, *args: hidden

    class RouterStandIn(BaseRouter):
        """vLLM's router template (``_select_experts``, the patched EPLB mapping step) around a plain-torch
        stand-in for the CUDA top-k kernels: V4's hash lookup of the input ids (layer 0) or the top-k of the
        gate logits; padding rows -1 where vLLM's own padding read (``_get_padding_mask``) says so."""

        routing_method_type: Any = None

        def __init__(self, layer: int):
            self.layer, self.eplb_state, self.capture_fn = layer, None, None

        def _compute_routing(self, hidden_states, router_logits, indices_type, *, input_ids=None):
            logits = hidden_states @ gates[self.layer]
            ids = tid2eid[input_ids].to(torch.int64) if input_ids is not None else logits.topk(TOP_K, dim=1).indices
            padding = fused_topk_bias_router._get_padding_mask(ids.shape[0])
            if padding is not None:
                ids = ids.masked_fill(padding.unsqueeze(1), -1)
            return logits.gather(1, ids.clamp(min=0)), ids.to(torch.int32)

    def moe_runner(layer: int, sequence_parallel: bool):
        """vLLM's real MoERunner class, with what bind reads: a modular unquantized method (its kernel a stand-in)."""
        runner = object.__new__(MoERunner)
        nn.Module.__init__(runner)
        qm = object.__new__(UnquantizedFusedMoEMethod)
        nn.Module.__init__(qm)
        qm.moe_kernel = SimpleNamespace(is_monolithic=False, fused_experts=None)  # stand-in for the CUDA modular kernel
        runner.layer_name = f"model.layers.{layer}.ffn.experts"
        runner.router = RouterStandIn(layer)
        runner.routed_experts = SimpleNamespace(quant_method=qm, expert_map=None)
        runner._quant_method = qm
        runner.moe_config = SimpleNamespace(is_sequence_parallel=sequence_parallel, dp_size=DP)
        return runner

    def route(runner, hidden, ids=None):
        runner.router._select_experts(hidden, hidden, input_ids=ids)
        return hidden

    class V4LayerStandIn(nn.Module):
        """A V4 decoder layer's call signature; attention and hyper-connections (CUDA kernels) left out, its
        MoE layer routed (layer 0 by hash of the input ids, as V4's hash layers)."""

        def __init__(self, layer: int, sequence_parallel: bool):
            super().__init__()
            self.layer, self.experts = layer, moe_runner(layer, sequence_parallel)

        def forward(self, x, positions, input_ids, post_mix=None, res_mix=None, residual=None, mega_gate_metadata=None):
            route(self.experts, x, input_ids if self.layer == 0 else None)
            return x, x, post_mix, res_mix

    def v4_model(sequence_parallel: bool):
        """DeepSeek-V4's real ``DeepseekV4Model.forward`` over stand-in layers."""
        model = object.__new__(v4.DeepseekV4Model)
        nn.Module.__init__(model)
        model.embed_tokens = nn.Embedding.from_pretrained(embed)
        model.use_native_mega_moe, model.use_sequence_parallel = False, sequence_parallel
        model.layers = nn.ModuleList(V4LayerStandIn(i, sequence_parallel) for i in range(LAYERS))
        model.start_layer, model.end_layer, model.norm, model._mtp_hidden_buffer = 0, LAYERS, nn.Identity(), None
        model.hc_head_fn = model.hc_head_scale = model.hc_head_base = None
        model.rms_norm_eps = model.hc_eps = 0.0
        return model, lambda ids, positions: model(ids, positions, None)

    class ExpertsStandIn(nn.Module):  # a MoE block's FusedMoE call, routed through the runner
        def __init__(self, runner):
            super().__init__()
            self.runner = runner

        def forward(self, hidden_states, router_logits):
            return route(self.runner, hidden_states)

    def block_model(sequence_parallel: bool):
        """Qwen3-MoE's real ``Qwen3MoeSparseMoeBlock.forward`` (``sequence_parallel_chunk``) per layer."""
        model = nn.Module()
        blocks = []
        for i in range(LAYERS):
            block = object.__new__(Qwen3MoeSparseMoeBlock)
            nn.Module.__init__(block)
            block.is_sequence_parallel = sequence_parallel
            block.experts = ExpertsStandIn(moe_runner(i, sequence_parallel))
            blocks.append(block)
        model.layers = nn.ModuleList(blocks)

        def forward(ids, positions):
            hidden = embed[ids]
            for block in blocks:
                hidden = block(hidden)
            return hidden

        return model, forward

    def truth(block: bool) -> list[list[list[int]]]:
        """Per step [L, E]: the experts of the step's real tokens, routed unsharded."""
        out = []
        for real, _ in STEPS:
            ids, hidden = input_ids[:real], embed[input_ids[:real]]
            layers = []
            for layer in range(LAYERS):
                top = (
                    tid2eid[ids].to(torch.int64)
                    if layer == 0 and not block
                    else (hidden @ gates[layer]).topk(TOP_K, dim=1).indices
                )
                layers.append(torch.bincount(top.flatten(), minlength=EXPERTS).tolist())
            out.append(layers)
        return out

    runner_standin = SimpleNamespace(  # the V1 runner's buffers bind and the step read (its methods are the real ones)
        device=torch.device("cpu"),
        vllm_config=SimpleNamespace(scheduler_config=SimpleNamespace(max_num_batched_tokens=MAX_TOKENS)),
        is_padding=torch.zeros(MAX_TOKENS, dtype=torch.bool),
    )
    config_standin = SimpleNamespace(compilation_config=SimpleNamespace(fast_moe_cold_start=False, static_forward_context={}))

    def plugin(rank: int, dp_size: int) -> VllmWorkerPlugin:
        """A worker plugin as ``configure`` makes one on TP rank ``rank`` of DP rank 0 (recording, no layout)."""
        cfg = parse_config({"scene_eplb": {"ring_entries": 16, "steps_per_entry": 1}})
        assert cfg is not None
        return VllmWorkerPlugin(
            config=cfg,
            role="prefill",
            engine="vllm 0.33.0",
            model=ModelGeometry(LAYERS, tuple(range(LAYERS)), EXPERTS, TOP_K),
            model_name="v4-stand-in",
            ep_size=dp_size * TP,
            ep_rank=rank,
            dp_rank=0,
            dp_size=dp_size,
            tp_rank=rank,
            tp_size=TP,
            source=SourceRanks(0, TP),
            source_rank=rank,
            contributes=rank == 0,
            observer=NullObserver("prefill", 16),
            exporter=Exporter(lambda export_id, timeout_s: None),
        )

    def record(make_model, sequence_parallel: bool, dp_size: int, rank: int) -> dict:
        """One TP rank's run of the steps: what it puts into an export, and its decisions."""
        parallel_state._TP = TPGroupStandIn(rank)
        model, forward = make_model(sequence_parallel)
        rt = plugin(rank, dp_size)
        worker_plugin._current = rt
        runner_standin.model = model
        rt.bind(runner_standin)
        rt.observer.start()
        for real, padded in STEPS:
            rt.begin_step(real)
            mask = GPUModelRunner._prepare_padding_mask(runner_standin, real, padded)
            with override_forward_context(create_forward_context(None, config_standin, is_padding=mask)):
                forward(input_ids[:padded], torch.arange(padded))
            rt.end_step(False)
        rt.observer.stop()
        worker_plugin._current = worker_plugin.NULL_PLUGIN
        part = rt.rank_record(rt.observer.snapshot())
        return {
            "counts": part.counts[:, :, :EXPERTS],
            "tokens": part.tokens,
            "contributes": rt.contributes,
            "source": [rt.source.base, rt.source.span],
            "skipped": rt.observer.status().skipped_passes,
        }

    def summed(make_model, sequence_parallel: bool, dp_size: int, block: bool) -> dict:
        """Every TP rank's part summed, as the export sums them, against the unsharded truth."""
        ranks = [record(make_model, sequence_parallel, dp_size, r) for r in range(TP)]
        total = sum(r["counts"] for r in ranks)
        return {
            "sharded": sequence_parallel,
            "exact": total.tolist() == truth(block),
            "total": int(total.sum()),
            "expected": sum(real for real, _ in STEPS) * TOP_K * LAYERS,
            "per_rank": [int(r["counts"].sum()) for r in ranks],
            "tokens": sum(r["tokens"] for r in ranks),
            "contributes": [r["contributes"] for r in ranks],
            "sources": [r["source"] for r in ranks],
            "skipped": sum(r["skipped"] for r in ranks),
        }

    out: dict[str, Any] = {"version": vllm.__version__, "real_tokens": sum(real for real, _ in STEPS)}
    # the shard decision, vLLM's own on real configs: V4 shards at DP > 1 on any all2all backend (here one
    # that parallel_config.use_sequence_parallel_moe does not list: the silent case), not at DP 1
    v4_configs = {
        "dp2": SimpleNamespace(
            parallel_config=ParallelConfig(
                data_parallel_size=DP,
                tensor_parallel_size=TP,
                enable_expert_parallel=True,
                all2all_backend="flashinfer_nvlink_two_sided",
            ),
            kernel_config=KernelConfig(moe_backend="auto"),
        ),
        "dp1": SimpleNamespace(
            parallel_config=ParallelConfig(data_parallel_size=1, tensor_parallel_size=TP, enable_expert_parallel=True),
            kernel_config=KernelConfig(moe_backend="auto"),
        ),
    }
    out["use_sequence_parallel_moe"] = {k: c.parallel_config.use_sequence_parallel_moe for k, c in v4_configs.items()}
    block_configs = {
        "dp2": ParallelConfig(
            data_parallel_size=DP, tensor_parallel_size=TP, enable_expert_parallel=True, all2all_backend="allgather_reducescatter"
        ),
        "dp1": ParallelConfig(data_parallel_size=1, tensor_parallel_size=TP, enable_expert_parallel=True),
    }
    for skip in ("1", "0"):  # V4 replaces the forward context's mask with its chunk's only under VLLM_MOE_SKIP_PADDING
        os.environ["VLLM_MOE_SKIP_PADDING"] = skip
        for name, c in v4_configs.items():
            sp = v4._use_sequence_parallel(c)
            out[f"v4_{name}_skip{skip}"] = summed(v4_model, sp, c.parallel_config.data_parallel_size, block=False)
        for name, pc in block_configs.items():
            out[f"block_{name}_skip{skip}"] = summed(block_model, pc.use_sequence_parallel_moe, pc.data_parallel_size, block=True)
    os.environ["VLLM_MOE_SKIP_PADDING"] = "1"

    # a model whose MoE layers disagree stops startup at bind
    mixed = nn.Module()
    mixed.layers = nn.ModuleList([V4LayerStandIn(0, True), V4LayerStandIn(1, False)])
    runner_standin.model = mixed
    try:
        plugin(0, DP).bind(runner_standin)
        out["mixed"] = None
    except SceneEplbError as exc:
        out["mixed"] = str(exc)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
