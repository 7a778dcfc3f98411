"""The vLLM-Ascend release this adapter was written against, and the check that refuses any other."""

from __future__ import annotations

from ...errors import SceneEplbError

SUPPORTED = {"vllm-ascend": "0.23.0.post1", "vllm": "0.23"}


def check_versions(ascend_version: str, vllm_version: str) -> None:
    """Refuse engine versions this adapter was not written for."""
    if ascend_version != SUPPORTED["vllm-ascend"] or not vllm_version.startswith(SUPPORTED["vllm"] + "."):
        raise SceneEplbError(f"vllm_scene_eplb's Ascend adapter is written for vllm-ascend {SUPPORTED['vllm-ascend']} with "
                             f"vLLM {SUPPORTED['vllm']}.x, found vllm-ascend {ascend_version} with vLLM {vllm_version}")
