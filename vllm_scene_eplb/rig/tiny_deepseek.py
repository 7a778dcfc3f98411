"""Generate a tiny random DeepSeek-V3 checkpoint for CPU tests: the architecture the field report
serves, with every part that changes how experts are routed and loaded.

- MLA attention with ``kv_lora_rank`` 512 + ``qk_rope_head_dim`` 64 (the only head size vLLM's CPU
  MLA backends take) and a ``q_lora_rank``;
- ``noaux_tc`` routing: sigmoid scores, ``n_group`` routing groups of which ``topk_group`` are
  kept, and a non-zero ``e_score_correction_bias`` (``skew`` scales a per-layer Zipf profile into
  it, so a few experts are hot: the bias moves selection only, not the expert weights);
- one shared expert beside the routed ones, ``first_k_dense_replace`` dense first layers;
- an MTP layer (``num_nextn_predict_layers`` 1) at ``model.layers.{num_layers}``, which
  transformers does not write, so vLLM's DeepSeek MTP drafter can run.

Expert weights are saved per expert (``...mlp.experts.{e}.gate_proj.weight``), as DeepSeek ships
them, so vLLM loads them through DeepSeek's own ``load_weights`` and its legacy expert mapping.

``--w8a8`` also writes the same weights as a ModelSlim-style W8A8_DYNAMIC checkpoint (``OUT_DIR-w8a8``,
``modelslim.write_w8a8``), the format vLLM-Ascend serves with ``--quantization ascend``: the routed
experts of the main model (``TinyDeepseekSpec.routed_expert_weight``) int8 with a per-output-channel scale and offset
each, everything else float, and the ``quant_model_description.json`` that says which is which.

    python -m vllm_scene_eplb.rig.tiny_deepseek OUT_DIR [--skew 1.0] [--seed 0] [--w8a8]
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from pathlib import Path

from .modelslim import write_w8a8
from .tiny_model import save_tokenizer


@dataclass(frozen=True)
class TinyDeepseekSpec:
    """Shape of the generated model (16 routed experts in 4 groups, top-4 of 2 groups, 1 dense and 2
    MoE layers, one MTP layer); the defaults run two vLLM CPU workers on two cores."""

    num_experts: int = 16
    num_groups: int = 4
    topk_group: int = 2
    top_k: int = 4
    num_shared: int = 1
    num_layers: int = 3
    first_dense: int = 1
    mtp_layers: int = 1
    hidden_size: int = 128
    intermediate_size: int = 256
    moe_intermediate_size: int = 128
    num_heads: int = 4
    q_lora_rank: int = 64
    kv_lora_rank: int = 512  # with qk_rope_head_dim 64: the MLA head size vLLM's CPU backends take
    qk_rope_head_dim: int = 64
    qk_nope_head_dim: int = 32
    v_head_dim: int = 32
    vocab_size: int = 512
    skew: float = 0.3
    seed: int = 0

    @property
    def moe_layers(self) -> list[int]:
        return list(range(self.first_dense, self.num_layers))

    def routed_expert_weight(self, name: str) -> bool:
        """A routed expert's projection weight of a main-model MoE layer: what ``--w8a8`` quantises (the
        MTP layer stays float: ModelSlim does not describe it, and vLLM-Ascend's note is to mark it FLOAT)."""
        m = re.fullmatch(r"model\.layers\.(\d+)\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight", name)
        return m is not None and int(m.group(1)) in self.moe_layers


def hf_config(spec: TinyDeepseekSpec) -> dict:
    """The config.json of the generated model."""
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "moe_intermediate_size": spec.moe_intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_nextn_predict_layers": spec.mtp_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_heads,
        "n_shared_experts": spec.num_shared,
        "n_routed_experts": spec.num_experts,
        "num_experts_per_tok": spec.top_k,
        "n_group": spec.num_groups,
        "topk_group": spec.topk_group,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "first_k_dense_replace": spec.first_dense,
        "moe_layer_freq": 1,
        "q_lora_rank": spec.q_lora_rank,
        "kv_lora_rank": spec.kv_lora_rank,
        "qk_rope_head_dim": spec.qk_rope_head_dim,
        "qk_nope_head_dim": spec.qk_nope_head_dim,
        "v_head_dim": spec.v_head_dim,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


def _random_weights(spec: TinyDeepseekSpec) -> dict:
    """The main model's state dict (per-expert names), randomly initialised with steady scales."""
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(spec.seed)
    keys = ("architectures", "model_type", "torch_dtype", "topk_method", "scoring_func", "moe_layer_freq", "rope_scaling")
    cfg = DeepseekV3Config(**{k: v for k, v in hf_config(spec).items() if k not in keys})
    model = DeepseekV3ForCausalLM(cfg).to(torch.float32).eval()  # type: ignore[arg-type]  # transformers' typing of .to
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "layernorm.weight")):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.05)
                if name.endswith(("o_proj.weight", "down_proj.weight", "down_proj")):
                    p.mul_(0.1)  # small layer outputs keep the residual's scale (and the routing) steady
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    return _per_expert(sd)


def _per_expert(sd: dict) -> dict:
    """transformers 5 keeps experts as fused 3-D tensors in memory; write them per expert, as
    DeepSeek's checkpoints are (``experts.{e}.{gate,up,down}_proj.weight``)."""
    out = {}
    for name, t in sd.items():
        if name.endswith("experts.gate_up_proj"):
            base = name[: -len("gate_up_proj")]
            gate, up = t.chunk(2, dim=1)
            for e in range(t.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = gate[e].contiguous()
                out[f"{base}{e}.up_proj.weight"] = up[e].contiguous()
        elif name.endswith("experts.down_proj"):
            base = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = t[e].contiguous()
        else:
            out[name] = t
    return out


def _skew_bias(sd: dict, spec: TinyDeepseekSpec) -> None:
    """Set every MoE layer's ``e_score_correction_bias`` to a non-zero base plus ``skew`` x a Zipf
    profile in a per-layer order (hot experts on the low ids, the first EP ranks of the linear layout)."""
    import torch

    gen = torch.Generator().manual_seed(spec.seed + 1)
    profile = 1.0 / torch.arange(1, spec.num_experts + 1, dtype=torch.float32)
    half = spec.num_experts // 2
    for layer in range(spec.num_layers + spec.mtp_layers):
        key = f"model.layers.{layer}.mlp.gate.e_score_correction_bias"
        if key not in sd:
            continue
        order = torch.cat([torch.randperm(half, generator=gen), half + torch.randperm(spec.num_experts - half, generator=gen)])
        bias = 0.01 * torch.randn(spec.num_experts, generator=gen)
        bias[order] += spec.skew * profile
        sd[key] = bias


def _mtp_layer(sd: dict, spec: TinyDeepseekSpec) -> None:
    """Add the MTP layers ``model.layers.{num_layers + i}``: a decoder layer shaped like the last MoE
    layer (fresh random weights), DeepSeek's ``enorm``/``hnorm``/``eh_proj`` and a ``shared_head``."""
    import torch

    last = f"model.layers.{spec.num_layers - 1}."
    gen = torch.Generator().manual_seed(spec.seed + 2)
    h = spec.hidden_size
    for i in range(spec.mtp_layers):
        mtp = f"model.layers.{spec.num_layers + i}."
        for name, t in list(sd.items()):
            if name.startswith(last):
                fresh = torch.ones_like(t) if t.dim() == 1 and "norm" in name else 0.05 * torch.randn(t.shape, generator=gen)
                sd[mtp + name[len(last) :]] = fresh.contiguous()
        sd[mtp + "enorm.weight"] = torch.ones(h)
        sd[mtp + "hnorm.weight"] = torch.ones(h)
        sd[mtp + "eh_proj.weight"] = (0.05 * torch.randn(h, 2 * h, generator=gen)).contiguous()
        sd[mtp + "shared_head.norm.weight"] = torch.ones(h)
        sd[mtp + "shared_head.head.weight"] = sd["lm_head.weight"].clone()
        sd[mtp + "embed_tokens.weight"] = sd["model.embed_tokens.weight"].clone()


def write_checkpoint(out_dir: str | Path, sd: dict, config: dict, vocab_size: int) -> Path:
    """Write ``sd`` as model.safetensors, ``config`` as config.json and a tokenizer into ``out_dir``
    (the generated DeepSeek models' one writer); returns the folder."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=1))
    save_tokenizer(out, vocab_size)
    return out


def make_tiny_deepseek(out_dir: str | Path, spec: TinyDeepseekSpec = TinyDeepseekSpec()) -> Path:
    """Write config.json, model.safetensors and a tokenizer for ``spec`` into ``out_dir``; returns the folder."""
    sd = _random_weights(spec)
    _mtp_layer(sd, spec)
    _skew_bias(sd, spec)
    return write_checkpoint(out_dir, sd, hf_config(spec), spec.vocab_size)


def generator_main(argv: list[str] | None, module: str, doc: str, spec_cls, make) -> int:
    """The generators' command line: ``python -m MODULE OUT_DIR [--skew] [--seed] [--w8a8]`` builds
    ``spec_cls(skew, seed)``, writes it with ``make`` and, with ``--w8a8``, its ModelSlim copy."""
    ap = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--skew", type=float, default=spec_cls.skew, help="routing skew (0 = near-uniform routing)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--w8a8", action="store_true", help="also write the ModelSlim W8A8_DYNAMIC checkpoint to OUT_DIR-w8a8")
    a = ap.parse_args(argv)
    spec = spec_cls(skew=a.skew, seed=a.seed)
    out = make(a.out_dir, spec)
    print(out)
    if a.w8a8:
        print(write_w8a8(out, out.with_name(out.name + "-w8a8"), spec.routed_expert_weight))
    return 0


def main(argv: list[str] | None = None) -> int:
    return generator_main(argv, "vllm_scene_eplb.rig.tiny_deepseek", __doc__, TinyDeepseekSpec, make_tiny_deepseek)


if __name__ == "__main__":
    raise SystemExit(main())
