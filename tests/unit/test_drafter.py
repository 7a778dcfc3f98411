"""Which speculative drafters have MoE layers of their own (``adapters/drafter``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_scene_eplb.adapters.drafter import moe_drafter


def config(method: str, draft_hf: dict | None):
    draft = None if draft_hf is None else SimpleNamespace(hf_config=SimpleNamespace(to_dict=lambda: draft_hf))
    return SimpleNamespace(speculative_config=SimpleNamespace(method=method, draft_model_config=draft))


@pytest.mark.parametrize(
    "cfg, found",
    [
        (config("mtp", {"n_routed_experts": 256}), "mtp"),
        (config("eagle", {"text_config": {"num_experts": 8}}), "eagle"),  # a multimodal drafter's text model
        (config("eagle", {"num_experts": 0}), None),  # a dense drafter
        (config("ngram", {"num_experts": 8}), None),  # vLLM hands n-gram the target's config; no drafter runs
        (config("mtp", None), None),
        (SimpleNamespace(speculative_config=None), None),
    ],
    ids=["mtp", "text-config", "dense", "ngram", "no-draft-model", "no-spec"],
)
def test_moe_drafter_names_the_method_only_when_its_drafter_has_moe_layers(cfg, found):
    assert moe_drafter(cfg) == found
