"""DeepSeek-V4 on one rank as vLLM-Ascend 0.23.0.post1 builds it, by its own code: what the preflight prices
of it (tests/ascend/test_preflight_v4_ascend.py).

Arguments: a V4 model folder (config.json, a tokenizer and ModelSlim's description, which ``--quantization
ascend`` reads), then JSON: ``layout`` (case -> block_size, mtp_layers, memory) and ``weights`` (case -> tp
and the recipe's vLLM-Ascend settings: flashcomm1, enable_dsa_cp, enable_shared_expert_dp). Prints one JSON
object: the same cases, each answered.

- ``layout``: per case, each layer's caches built by vLLM-Ascend's own classes in the order its
  ``DeepseekV4Attention`` builds them (the compressor's state, the indexer's keys and its compressor's
  state, the window, then the compressed entries as its ``DSAAttention`` gives their spec), the MTP layers'
  windows last; their specs through vLLM 0.23's ``get_kv_cache_groups`` and
  ``get_kv_cache_config_from_groups`` as vLLM-Ascend patches them (``patch/platform/patch_kv_cache_utils.py``):
  num_blocks, the tensors' bytes, and the groups (kind, block size, window, layers).
- ``weights``: vLLM-Ascend's own ``DeepseekV4Attention`` for one layer of each compress ratio, its
  ``DeepseekV2MLP`` as ``DeepseekV4MoE`` builds the shared expert, and vLLM's ``VocabParallelEmbedding`` /
  ``ParallelLMHead`` as its ``DeepseekV4Model`` builds them, under the recipe's settings (its custom ops and
  ascend config set up as a worker does, in the checkpoint's bfloat16 as vLLM's model loader sets it): the bytes of every
  linear and embedding parameter (weights, scales and offsets) of each, and each linear's shape on the rank.

Stand-ins: the NPU runtime's (tests/scripts/ascend_deepseek_load.py); the compressed entries' spec built as
``DSAAttention.get_kv_cache_spec`` builds it (the layer itself needs the attention backend's NPU kernels);
the TP group: rank 0 of the recipe's TP size, the only thing the built layers ask of it (no collective runs
at build time). The weights are ``torch.empty`` parameters whose pages are never touched.
"""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import torch
from ascend_deepseek_load import npu_runtime_stand_ins


def layout(model: str, cases: dict) -> dict:
    import vllm_ascend.patch.platform.patch_kv_cache_utils  # noqa: F401  # vLLM-Ascend's V4 grouping and tensors
    from vllm.config import CacheConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups, get_kv_cache_groups
    from vllm.v1.kv_cache_interface import SlidingWindowMLASpec
    from vllm_ascend.core.kv_cache_interface import AscendMLAAttentionSpec
    from vllm_ascend.models.deepseek_v4 import (
        AscendCompressorStateCache,
        AscendDeepseekV4IndexerCache,
        AscendDeepseekV4SWACache,
        _dsv4_block_sizes,
    )

    out = {}
    for name, case in cases.items():
        bs = case["block_size"]
        vc = VllmConfig(model_config=ModelConfig(model=model, dtype="bfloat16"), cache_config=CacheConfig(block_size=bs))
        cfg = vc.model_config.hf_config
        blocks = _dsv4_block_sizes()[bs][0]
        specs = {}
        with set_current_vllm_config(vc):
            for i, ratio in enumerate(cfg.compress_ratios[: cfg.num_hidden_layers]):
                at, caches = f"model.layers.{i}.self_attn", []
                if ratio > 1:
                    coff, state = (2, blocks[2]) if ratio == 4 else (1, blocks[3])
                    caches.append(
                        AscendCompressorStateCache(2 * coff * cfg.head_dim, torch.float32, ratio, state, f"{at}.compressor.st")
                    )
                if ratio == 4:
                    caches.append(
                        AscendDeepseekV4IndexerCache(cfg.index_head_dim, torch.int8, f"{at}.indexer.k", vc.cache_config, 4)
                    )
                    index_state = 2 * 2 * cfg.index_head_dim
                    caches.append(
                        AscendCompressorStateCache(index_state, torch.float32, 4, blocks[2], f"{at}.indexer.compressor.st")
                    )
                caches.append(
                    AscendDeepseekV4SWACache(cfg.head_dim, cfg.sliding_window, torch.bfloat16, f"{at}.swa", vc.cache_config)
                )
                specs.update({cache.prefix: cache.get_kv_cache_spec(vc) for cache in caches})
                if ratio > 1:  # DSAAttention.get_kv_cache_spec (models/layer/attention/layer.py)
                    specs[f"{at}.attn"] = AscendMLAAttentionSpec(
                        block_size=blocks[0],
                        num_kv_heads=1,
                        head_size=cfg.head_dim,
                        dtype=vc.model_config.dtype,
                        model_version="deepseek_v4",
                        compress_ratio=ratio,
                        cache_dtype_str=vc.cache_config.cache_dtype,
                    )
            for i in range(case["mtp_layers"]):
                swa = AscendDeepseekV4SWACache(
                    cfg.head_dim, cfg.sliding_window, torch.bfloat16, f"model.mtp.{i}.swa", vc.cache_config
                )
                specs[swa.prefix] = swa.get_kv_cache_spec(vc)
            groups = get_kv_cache_groups(vc, specs)
            config = get_kv_cache_config_from_groups(vc, groups, case["memory"])
        described = []
        for group in groups:
            inner = next(iter(group.kv_cache_spec.kv_cache_specs.values()))
            windowed = isinstance(inner, SlidingWindowMLASpec)
            described.append(["window" if windowed else "mla", inner.block_size, inner.sliding_window if windowed else None])
        out[name] = {
            "num_blocks": config.num_blocks,
            "tensor_bytes": sum(t.size for t in config.kv_cache_tensors),
            "groups": described,
        }
    return out


def _bytes(module: torch.nn.Module) -> tuple[int, dict]:
    """Bytes of a module's linear and embedding parameters (weights, scales, offsets), and each linear's shape."""
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    total, shapes = 0, {}
    for name, sub in module.named_modules():
        if isinstance(sub, (LinearBase, VocabParallelEmbedding)):
            total += sum(p.numel() * p.element_size() for p in sub.parameters(recurse=False))
            shapes[name or "."] = list(sub.weight.shape)
    return total, shapes


def weights(model: str, tp: int, settings: dict) -> dict:
    import vllm.distributed.parallel_state as ps
    from vllm.config import ModelConfig, ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
    from vllm.utils.torch_utils import set_default_torch_dtype
    from vllm_ascend.ascend_config import clear_ascend_config, init_ascend_config
    from vllm_ascend.models.deepseek_v4 import DeepseekV2MLP, DeepseekV4Attention
    from vllm_ascend.utils import register_ascend_customop

    clear_ascend_config()  # vLLM-Ascend's own reset: its config, enable_sp() and enable_dsa_cp() read anew
    os.environ["VLLM_ASCEND_ENABLE_FLASHCOMM1"] = "1" if settings.get("flashcomm1") else "0"
    vc = VllmConfig(
        model_config=ModelConfig(model=model, quantization="ascend", dtype="bfloat16", enforce_eager=True),
        parallel_config=ParallelConfig(tensor_parallel_size=tp, enable_expert_parallel=True),
        additional_config={k: v for k, v in settings.items() if k != "flashcomm1"},
    )
    ps._TP = SimpleNamespace(world_size=tp, rank_in_group=0, rank=0, local_rank=0)
    cfg = vc.model_config.hf_config
    out: dict = {"attention": {}, "shapes": {}}
    with set_current_vllm_config(vc), set_default_torch_dtype(vc.model_config.dtype):  # as vLLM's model loader builds
        register_ascend_customop(vc)
        init_ascend_config(vc)
        for ratio in sorted(set(cfg.compress_ratios[: cfg.num_hidden_layers])):
            layer, positions = cfg.compress_ratios.index(ratio), cfg.rope_parameters["original_max_position_embeddings"]
            prefix = f"model.layers.{layer}.self_attn"  # with the positions DeepseekV2DecoderLayer gives it
            attention = DeepseekV4Attention(vc, cfg, positions, vc.cache_config, vc.quant_config, prefix=prefix)
            out["attention"][str(ratio)], out["shapes"][f"attention {ratio}"] = _bytes(attention)
        shared = DeepseekV2MLP(
            cfg.hidden_size,
            cfg.moe_intermediate_size * cfg.n_shared_experts,
            cfg.hidden_act,
            quant_config=vc.quant_config,
            is_sequence_parallel=vc.parallel_config.use_sequence_parallel_moe,
            reduce_results=False,
            prefix=f"model.layers.{cfg.num_hidden_layers - 1}.mlp.shared_experts",
        )
        out["shared"], out["shapes"]["shared"] = _bytes(shared)
        embed = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, quant_config=vc.quant_config, prefix="model.embed_tokens")
        head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, quant_config=vc.quant_config, prefix="lm_head")
        out["embed_and_head"] = _bytes(embed)[0] + _bytes(head)[0]
    return out


def main() -> None:
    model, asked = sys.argv[1], json.loads(sys.argv[2])
    npu_runtime_stand_ins()
    from vllm.platforms import current_platform

    current_platform.pre_register_and_update()
    built = {name: weights(model, case["tp"], case["settings"]) for name, case in asked["weights"].items()}
    print(json.dumps({"layout": layout(model, asked["layout"]), "weights": built}))


if __name__ == "__main__":
    main()
