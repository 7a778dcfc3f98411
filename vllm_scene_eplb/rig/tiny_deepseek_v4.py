"""Generate a tiny random DeepSeek-V4 checkpoint for CPU tests: the field report's model family, with
every part that changes how its experts are routed and loaded.

- **hash layers**: the first ``num_hash_layers`` MoE layers route by a table on the token id
  (``layers.N.ffn.gate.tid2eid`` [vocab, top_k], int32; ``skew`` draws its rows from a Zipf profile
  over the experts, so a few experts are hot there too); the others by ``sqrtsoftplus`` scores with a
  correction bias (``layers.N.ffn.gate.bias``, ``noaux_tc``; ``skew`` scales a Zipf profile into it);
- one shared expert, top-6 of 64 routed experts (the smallest expert count and the top-k that
  vLLM's CPU V4 routing kernels ``hash_topk_cpu`` / ``biased_topk_cpu`` take), no routing groups,
  every layer MoE;
- hyper-connections (``hc_mult`` 4: ``hc_attn_*``, ``hc_ffn_*``, ``hc_head_*``) and the compressed
  sparse attention's own tensors per layer from ``compress_ratios`` (0: sliding window only; 4: a
  compressor and an indexer; 128: a compressor), ``o_groups``;
- one MTP layer (``mtp.0.*``: a score-routed block with ``e_proj`` / ``h_proj`` / ``enorm`` / ``hnorm``).

Tensors are named as DeepSeek ships V4 (``layers.N.ffn.experts.E.w1.weight``, ``embed.weight``,
``head.weight``), the names vLLM's ``DeepseekV4ForCausalLM.load_weights`` maps; experts are float32
(``expert_dtype`` ``bf16``: no MXFP4 scales). tests/engine/test_vllm_deepseek_v4.py loads every
tensor through that loader and checks each parameter it fills.

``--w8a8`` also writes the same weights as a ModelSlim-style W8A8_DYNAMIC checkpoint (``OUT_DIR-w8a8``,
``modelslim.write_w8a8``), as vLLM-Ascend serves V4 on 910C (``--quantization ascend``): the routed
experts of the main model int8 with a per-output-channel scale and offset each
(``layers.N.ffn.experts.E.w1.weight_scale``), everything else float, described by DeepSeek's names.

    python -m vllm_scene_eplb.rig.tiny_deepseek_v4 OUT_DIR [--skew 1.0] [--seed 0] [--w8a8]
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .tiny_deepseek import generator_main, write_checkpoint


@dataclass(frozen=True)
class TinyDeepseekV4Spec:
    """Shape of the generated model: 5 MoE layers (3 hash-routed), 64 experts top-6, one of each
    attention kind, one MTP layer; a few MB in float32."""

    num_experts: int = 64
    top_k: int = 6
    num_layers: int = 5
    num_hash_layers: int = 3
    compress_ratios: tuple[int, ...] = (0, 0, 4, 128, 4, 0)  # per layer, the MTP layer's last
    mtp_layers: int = 1
    hidden_size: int = 64
    moe_intermediate_size: int = 32
    num_heads: int = 4
    head_dim: int = 512  # with qk_rope_head_dim 64, as V4's attention is shaped
    qk_rope_head_dim: int = 64
    q_lora_rank: int = 32
    o_groups: int = 2
    o_lora_rank: int = 32
    index_heads: int = 4
    index_head_dim: int = 128
    index_topk: int = 512
    hc_mult: int = 4
    vocab_size: int = 512
    skew: float = 0.3
    seed: int = 0
    # the hash layers' routed experts' output weights (w2) at 0.1 of the other weights' scale, as every
    # block output: small outputs keep the residual's scale and the score layers' routing steady; at 1.0
    # a hash layer's expert moves the answers enough that a wrong one shows in them (the routing of a
    # hash layer is the token's, whatever the residual; tests/engine/test_vllm_deepseek_v4_served.py's model)
    hash_expert_output_scale: float = 0.1

    @property
    def moe_layers(self) -> list[int]:
        return list(range(self.num_layers))

    @property
    def hash_layers(self) -> list[int]:
        return list(range(self.num_hash_layers))

    def routed_expert_weight(self, name: str) -> bool:
        """A routed expert's projection weight of a main-model MoE layer, by DeepSeek's own name
        (``layers.N.ffn.experts.E.w1.weight``): what ``--w8a8`` quantises (the MTP layer stays float)."""
        m = re.fullmatch(r"layers\.(\d+)\.ffn\.experts\.\d+\.w[123]\.weight", name)
        return m is not None and int(m.group(1)) in self.moe_layers


def hf_config(spec: TinyDeepseekV4Spec) -> dict:
    """The config.json of the generated model (the fields vLLM's V4 model reads)."""
    return {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "moe_intermediate_size": spec.moe_intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_nextn_predict_layers": spec.mtp_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": 1,
        "head_dim": spec.head_dim,
        "qk_rope_head_dim": spec.qk_rope_head_dim,
        "q_lora_rank": spec.q_lora_rank,
        "o_groups": spec.o_groups,
        "o_lora_rank": spec.o_lora_rank,
        "n_routed_experts": spec.num_experts,
        "n_shared_experts": 1,
        "num_experts_per_tok": spec.top_k,
        "num_hash_layers": spec.num_hash_layers,
        "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc",
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.5,
        "swiglu_limit": 10.0,
        "hc_mult": spec.hc_mult,
        "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6,
        "sliding_window": 128,
        "compress_ratios": list(spec.compress_ratios),
        "index_n_heads": spec.index_heads,
        "index_head_dim": spec.index_head_dim,
        "index_topk": spec.index_topk,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096,
        # YaRN as V4-Flash ships it (factor 16, beta 32 / 1), over a short original context: vLLM-Ascend's
        # V4 reads every one of these keys when it builds a layer
        "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 256, "beta_fast": 32, "beta_slow": 1},
        "rope_theta": 10000.0,
        "compress_rope_theta": 160000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "expert_dtype": "bf16",  # not MXFP4: float experts, no expert scales
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


def _shapes_of_attention(spec: TinyDeepseekV4Spec, ratio: int) -> dict[str, tuple[int, ...]]:
    """A block's attention tensors (``attn.``), their shapes in the checkpoint, by compress ratio."""
    h, hd, q = spec.hidden_size, spec.head_dim, spec.q_lora_rank
    out: dict[str, tuple[int, ...]] = {
        "attn_sink": (spec.num_heads,),
        "wq_a.weight": (q, h),
        "wkv.weight": (hd, h),
        "q_norm.weight": (q,),
        "wq_b.weight": (spec.num_heads * hd, q),
        "kv_norm.weight": (hd,),
        "wo_a.weight": (spec.o_groups * spec.o_lora_rank, spec.num_heads * hd // spec.o_groups),
        "wo_b.weight": (h, spec.o_groups * spec.o_lora_rank),
    }
    if ratio:
        width = (2 if ratio == 4 else 1) * hd  # ratio 4 compresses overlapping windows: two halves
        out |= {
            "compressor.ape": (ratio, width),
            "compressor.wkv.weight": (width, h),
            "compressor.wgate.weight": (width, h),
            "compressor.norm.weight": (hd,),
        }
    if ratio == 4:  # the indexer picks the compressed entries a query attends to
        ih = spec.index_head_dim
        out |= {
            "indexer.wq_b.weight": (spec.index_heads * ih, q),
            "indexer.weights_proj.weight": (spec.index_heads, h),
            "indexer.compressor.ape": (ratio, 2 * ih),
            "indexer.compressor.wkv.weight": (2 * ih, h),
            "indexer.compressor.wgate.weight": (2 * ih, h),
            "indexer.compressor.norm.weight": (ih,),
        }
    return {"attn." + k: v for k, v in out.items()}


def _shapes_of_block(spec: TinyDeepseekV4Spec, ratio: int, hashed: bool) -> dict[str, tuple[int, ...]]:
    """One decoder block's float tensors (hyper-connections, attention, norms, gate, shared and routed
    experts), by name below ``layers.N.``; a hash layer's ``tid2eid`` is added by the caller."""
    h, inter, hc = spec.hidden_size, spec.moe_intermediate_size, spec.hc_mult
    mix = (2 + hc) * hc
    out: dict[str, tuple[int, ...]] = {}
    for part in ("attn", "ffn"):
        out |= {f"hc_{part}_fn": (mix, hc * h), f"hc_{part}_base": (mix,), f"hc_{part}_scale": (3,)}
    out |= _shapes_of_attention(spec, ratio)
    out |= {"attn_norm.weight": (h,), "ffn_norm.weight": (h,), "ffn.gate.weight": (spec.num_experts, h)}
    if not hashed:
        out["ffn.gate.bias"] = (spec.num_experts,)
    for expert in ["shared_experts"] + [f"experts.{e}" for e in range(spec.num_experts)]:
        out |= {
            f"ffn.{expert}.w1.weight": (inter, h),
            f"ffn.{expert}.w3.weight": (inter, h),
            f"ffn.{expert}.w2.weight": (h, inter),
        }
    return out


def checkpoint_shapes(spec: TinyDeepseekV4Spec) -> dict[str, tuple[int, ...]]:
    """Every float tensor of the checkpoint and its shape (the hash layers' int32 ``tid2eid`` apart)."""
    h, hc = spec.hidden_size, spec.hc_mult
    head = {"hc_head_fn": (hc, hc * h), "hc_head_base": (hc,), "hc_head_scale": (1,)}
    out: dict[str, tuple[int, ...]] = {
        "embed.weight": (spec.vocab_size, h),
        "head.weight": (spec.vocab_size, h),
        "norm.weight": (h,),
    }
    out |= head
    for layer in range(spec.num_layers):
        block = _shapes_of_block(spec, spec.compress_ratios[layer], layer < spec.num_hash_layers)
        out |= {f"layers.{layer}.{k}": v for k, v in block.items()}
    for i in range(spec.mtp_layers):
        mtp = _shapes_of_block(spec, spec.compress_ratios[spec.num_layers + i], hashed=False)
        mtp |= {"enorm.weight": (h,), "hnorm.weight": (h,), "e_proj.weight": (h, h), "h_proj.weight": (h, h), "norm.weight": (h,)}
        out |= {f"mtp.{i}.{k}": v for k, v in (mtp | head).items()}
    return out


def _zipf(spec: TinyDeepseekV4Spec, generator):
    """Expert popularity: 1/rank^skew in a random order of the experts (uniform at skew 0)."""
    import torch

    ranks = torch.randperm(spec.num_experts, generator=generator).to(torch.float32) + 1
    return ranks ** (-spec.skew)


def _hash_expert_output(spec: TinyDeepseekV4Spec, name: str) -> bool:
    """A routed expert's output weight in one of the main model's hash layers."""
    m = re.fullmatch(r"layers\.(\d+)\.ffn\.experts\.\d+\.w2\.weight", name)
    return m is not None and int(m.group(1)) in spec.hash_layers


def random_weights(spec: TinyDeepseekV4Spec) -> dict:
    """The checkpoint's state dict: random weights at steady scales, norms and scales at one, the
    hash tables drawn per token from a skewed profile (top_k distinct experts a row)."""
    import torch

    gen = torch.Generator().manual_seed(spec.seed)
    sd = {}
    for name, shape in checkpoint_shapes(spec).items():
        if name.endswith(("norm.weight", "_scale")):
            t = torch.ones(shape)
        elif name.endswith("gate.bias"):
            t = 0.01 * torch.randn(shape, generator=gen) + 0.5 * _zipf(spec, gen)
        else:
            t = 0.05 * torch.randn(shape, generator=gen)
            if name.endswith(("w2.weight", "wo_b.weight")):
                t *= spec.hash_expert_output_scale if _hash_expert_output(spec, name) else 0.1
        sd[name] = t.contiguous()
    for layer in spec.hash_layers:
        p = _zipf(spec, gen).expand(spec.vocab_size, -1)
        sd[f"layers.{layer}.ffn.gate.tid2eid"] = torch.multinomial(p, spec.top_k, generator=gen).to(torch.int32).contiguous()
    return sd


def make_tiny_deepseek_v4(out_dir: str | Path, spec: TinyDeepseekV4Spec = TinyDeepseekV4Spec()) -> Path:
    """Write config.json, model.safetensors and a tokenizer for ``spec`` into ``out_dir``; returns the folder."""
    return write_checkpoint(out_dir, random_weights(spec), hf_config(spec), spec.vocab_size)


def main(argv: list[str] | None = None) -> int:
    return generator_main(argv, "vllm_scene_eplb.rig.tiny_deepseek_v4", __doc__, TinyDeepseekV4Spec, make_tiny_deepseek_v4)


if __name__ == "__main__":
    raise SystemExit(main())
