"""Generate a tiny random Qwen3-MoE checkpoint (and a word-level tokenizer) for CPU tests and the demo.

Needs torch and transformers (installed with vLLM).

``skew`` > 0 makes routing deliberately uneven: every token embedding carries a constant component
on hidden dim 0, and each layer's router adds ``skew * profile[e]`` on that dim, so a few experts
are hot in every layer (a Zipf-like profile; its hotter half sits on ids [0, E/2) in a per-layer
order, i.e. on the first EP ranks of the linear layout). ``skew`` = 0 gives near-uniform
routing. Experts are large relative to attention so that MoE dominates a prefill step.

    python -m vllm_scene_eplb.rig.tiny_model OUT_DIR [--experts 8] [--layers 2] [--skew 2.0]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TinyMoeSpec:
    """Shape of the generated model; the defaults run two vLLM CPU workers on two cores."""

    num_experts: int = 8
    top_k: int = 2
    num_layers: int = 2
    hidden_size: int = 128
    moe_intermediate_size: int = 512
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    vocab_size: int = 512
    skew: float = 0.0
    seed: int = 0
    fused_experts: bool = False  # save experts as 3-D tensors (experts.gate_up_proj [E, 2I, H]), not per expert


def hf_config(spec: TinyMoeSpec) -> dict:
    """The config.json of the generated model."""
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.moe_intermediate_size,
        "moe_intermediate_size": spec.moe_intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "num_experts": spec.num_experts,
        "num_experts_per_tok": spec.top_k,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


def make_tiny_moe(out_dir: str | Path, spec: TinyMoeSpec = TinyMoeSpec()) -> Path:
    """Write config.json and model.safetensors for ``spec`` into ``out_dir``; returns the folder."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    out = Path(out_dir)
    torch.manual_seed(spec.seed)
    cfg = Qwen3MoeConfig(**{k: v for k, v in hf_config(spec).items() if k not in ("architectures", "model_type")})
    model = Qwen3MoeForCausalLM(cfg).to(torch.float32).eval()  # type: ignore[arg-type]  # transformers' typing of .to
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.05)
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(("o_proj.weight", "down_proj")):
                p.mul_(0.1)  # small layer outputs keep the residual's scale (and the routing) steady
        if spec.skew > 0:
            model.model.embed_tokens.weight[:, 0] = 0.2
            profile = 1.0 / torch.arange(1, spec.num_experts + 1, dtype=torch.float32)
            gen = torch.Generator().manual_seed(spec.seed + 1)
            half = spec.num_experts // 2
            for layer in model.model.layers:
                # nothing writes hidden dim 0 back into the residual, so every layer's router sees it
                layer.self_attn.o_proj.weight[0] = 0.0
                layer.mlp.experts.down_proj[:, 0] = 0.0
                # hottest half of the profile on ids [0, E/2): the ranks that own low ids under the
                # engines' linear layout get most of the work, the case a fitted layout fixes
                order = torch.cat(
                    [torch.randperm(half, generator=gen), half + torch.randperm(spec.num_experts - half, generator=gen)]
                )
                layer.mlp.gate.weight.mul_(0.3)  # weaker token-dependent routing: the skew dominates
                layer.mlp.gate.weight[order, 0] = spec.skew * profile
    if spec.fused_experts:  # transformers 5 holds them fused; save_pretrained would split them per expert
        from safetensors.torch import save_file

        model.config.architectures = [type(model).__name__]  # what save_pretrained would write
        model.config.save_pretrained(out)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / "model.safetensors"), {"format": "pt"})
    else:
        model.save_pretrained(out, safe_serialization=True)
    save_tokenizer(out, spec.vocab_size)
    cfg_path = out / "config.json"
    doc = json.loads(cfg_path.read_text())
    doc["torch_dtype"] = "float32"
    cfg_path.write_text(json.dumps(doc, indent=1))
    return out


def save_tokenizer(out: Path, vocab_size: int) -> None:
    """A word-level tokenizer ("w3 w17 ...") whose decode/encode round-trips any id sequence, so text
    benchmarks (vllm bench serve, random dataset) can drive the model."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>").save_pretrained(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vllm_scene_eplb.rig.tiny_model", description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--experts", type=int, default=TinyMoeSpec.num_experts)
    ap.add_argument("--top-k", type=int, default=TinyMoeSpec.top_k)
    ap.add_argument("--layers", type=int, default=TinyMoeSpec.num_layers)
    ap.add_argument("--hidden", type=int, default=TinyMoeSpec.hidden_size)
    ap.add_argument("--moe-intermediate", type=int, default=TinyMoeSpec.moe_intermediate_size)
    ap.add_argument("--skew", type=float, default=0.0, help="router skew (0 = near-uniform routing)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fused-experts", action="store_true", help="save experts as fused 3-D tensors (vLLM's fused loader path)")
    a = ap.parse_args(argv)
    spec = TinyMoeSpec(
        num_experts=a.experts,
        top_k=a.top_k,
        num_layers=a.layers,
        hidden_size=a.hidden,
        moe_intermediate_size=a.moe_intermediate,
        skew=a.skew,
        seed=a.seed,
        fused_experts=a.fused_experts,
    )
    print(make_tiny_moe(a.out_dir, spec))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
