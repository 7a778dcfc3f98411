"""The speculative drafter a server runs, as far as expert placement cares: whether it has MoE
layers of its own (DeepSeek's MTP layer), which no layout has rows for (both engines' adapters ask)."""

from __future__ import annotations

MODEL_FREE_DRAFTS = ("ngram", "ngram_gpu", "suffix")  # vLLM's speculative methods that run no drafter model


def moe_drafter(vllm_config) -> str | None:
    """The speculative method when its drafter model has MoE layers; None without a drafter, for a
    draft without a model (vLLM hands n-gram drafts the target's config: no model runs) or a dense one."""
    spec = getattr(vllm_config, "speculative_config", None)
    draft = getattr(spec, "draft_model_config", None) if spec is not None else None
    if spec is None or draft is None or spec.method in MODEL_FREE_DRAFTS:
        return None
    hf = draft.hf_config.to_dict()
    text = hf.get("text_config") or {}
    moe = any((src.get(k) or 0) > 0 for src in (hf, text) for k in ("n_routed_experts", "num_experts", "num_local_experts"))
    return spec.method if moe else None
